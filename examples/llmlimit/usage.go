package llmlimit

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"math"
	"strings"
	"sync"
)

// Usage is what a model's answer cost, in tokens.
type Usage struct {
	Input, Output int64
}

// ReadUsage reads the usage of a JSON answer, in either API's format (OpenAI's
// prompt_tokens and completion_tokens, or input_tokens and output_tokens of its
// Responses API; Anthropic's input_tokens, its cached input included, and
// output_tokens); ok false when body reports none, or a count below 0.
func ReadUsage(body []byte) (u Usage, ok bool) {
	var e event
	if json.Unmarshal(body, &e) != nil {
		return Usage{}, false
	}
	u.Input, u.Output, ok = e.usage().split()
	return u, ok
}

// Total is what the answer cost in all, at most math.MaxInt64.
func (u Usage) Total() int64 { return addCapped(u.Input, u.Output) }

// addCapped is a + b, both at least 0, at most math.MaxInt64.
func addCapped(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// apiUsage is the usage object of either API's answers: OpenAI's chat completions and
// completions (prompt_tokens, completion_tokens, total_tokens), OpenAI's Responses API
// (input_tokens, its cached input included, output_tokens, total_tokens) and Anthropic's
// messages (input_tokens, the cached input apart, and output_tokens).
type apiUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	TotalTokens      *int64 `json:"total_tokens"`

	InputTokens              *int64 `json:"input_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
}

// UnmarshalJSON reads the counts as numbers: 30 or 30.0 (as a writer of floats sends it)
// is 30; a fraction, or a count past int64, is below 0 (unknown).
func (u *apiUsage) UnmarshalJSON(b []byte) error {
	var w struct {
		PromptTokens             *json.Number `json:"prompt_tokens"`
		CompletionTokens         *json.Number `json:"completion_tokens"`
		TotalTokens              *json.Number `json:"total_tokens"`
		InputTokens              *json.Number `json:"input_tokens"`
		CacheCreationInputTokens *json.Number `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     *json.Number `json:"cache_read_input_tokens"`
		OutputTokens             *json.Number `json:"output_tokens"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	n := func(p *json.Number) *int64 {
		if p == nil {
			return nil
		}
		v, err := p.Int64()
		if f, ferr := p.Float64(); err != nil && ferr == nil && f == math.Trunc(f) && math.Abs(f) < math.MaxInt64 {
			v, err = int64(f), nil
		}
		if err != nil {
			v = -1
		}
		return &v
	}
	*u = apiUsage{PromptTokens: n(w.PromptTokens), CompletionTokens: n(w.CompletionTokens), TotalTokens: n(w.TotalTokens),
		InputTokens: n(w.InputTokens), OutputTokens: n(w.OutputTokens)}
	for _, c := range []struct {
		to   *int64
		from *json.Number
	}{{&u.CacheCreationInputTokens, w.CacheCreationInputTokens}, {&u.CacheReadInputTokens, w.CacheReadInputTokens}} {
		if v := n(c.from); v != nil {
			*c.to = *v
		}
	}
	return nil
}

// input and output are the tokens u reports of each (ok false when it reports neither,
// or a count below 0, which no API sends): OpenAI's total_tokens, when it says more than
// its parts, counts as output. Sums stop at math.MaxInt64.
func (u *apiUsage) split() (in, out int64, ok bool) {
	if u == nil {
		return 0, 0, false
	}
	for _, p := range []*int64{u.PromptTokens, u.CompletionTokens, u.TotalTokens, u.InputTokens, u.OutputTokens, &u.CacheCreationInputTokens, &u.CacheReadInputTokens} {
		if p != nil && *p < 0 {
			return 0, 0, false
		}
	}
	val := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	switch {
	case u.PromptTokens != nil || u.CompletionTokens != nil:
		in, out = val(u.PromptTokens), val(u.CompletionTokens)
		return in, max(out, val(u.TotalTokens)-in), true
	case u.InputTokens != nil || u.OutputTokens != nil:
		in = addCapped(addCapped(val(u.InputTokens), u.CacheCreationInputTokens), u.CacheReadInputTokens)
		out = val(u.OutputTokens)
		return in, max(out, val(u.TotalTokens)-in), true
	case u.TotalTokens != nil:
		return 0, *u.TotalTokens, true
	}
	return 0, 0, false
}

// event is the part of a JSON answer, or of one event of a stream, that a meter reads,
// in either API's format.
type event struct {
	Type    string    `json:"type"` // Anthropic's and the Responses API's event types
	Usage   *apiUsage `json:"usage"`
	Message *struct { // Anthropic's message_start
		Usage *apiUsage `json:"usage"`
	} `json:"message"`
	Response *struct { // the Responses API's response.completed, and the others of its kind
		Usage *apiUsage `json:"usage"`
	} `json:"response"`
	Choices []struct {
		Delta *struct { // chat completions' chunks
			Content   *string           `json:"content"`
			ToolCalls []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text *string `json:"text"` // legacy completions' chunks
	} `json:"choices"`
	Delta json.RawMessage `json:"delta"` // the Responses API's output deltas
}

// usage is the usage object e carries, wherever its API puts it.
func (e *event) usage() *apiUsage {
	switch {
	case e.Message != nil && e.Message.Usage != nil:
		return e.Message.Usage
	case e.Response != nil && e.Response.Usage != nil:
		return e.Response.Usage
	}
	return e.Usage
}

// produced reports whether e, an event of a stream, carries some of the answer: a delta
// of content, a tool call, or text.
func (e *event) produced() bool {
	for _, c := range e.Choices {
		if c.Delta != nil && (c.Delta.Content != nil && *c.Delta.Content != "" || len(c.Delta.ToolCalls) > 0) ||
			c.Text != nil && *c.Text != "" {
			return true
		}
	}
	switch {
	case e.Type == "content_block_delta": // Anthropic's
		return true
	case strings.HasPrefix(e.Type, "response.") && strings.HasSuffix(e.Type, ".delta"): // the Responses API's
		return len(e.Delta) > 0 && !bytes.Equal(e.Delta, []byte(`""`))
	}
	return false
}

// maxBody bounds the JSON answers a Meter holds whole to read their usage: a larger one
// (embeddings of many inputs) is read as it passes, holding one value at a time.
const maxBody = 1 << 20

// maxLine bounds a line of a stream the meter holds to parse: a longer one (no model
// sends one) is passed on, and not read.
const maxLine = 1 << 20

// Meter reads a model's answer as it passes to the client: a JSON body whole, or a
// stream of Server-Sent Events event by event, its lines ended by LF, CRLF or CR. It
// reads an answer compressed with gzip as the client gets it, and learns the usage the
// answer reports (OpenAI's last chunk, with stream_options.include_usage; the Responses
// API's response.completed; Anthropic's message_start and message_delta). For a stream
// that reports none, or is cut before it does (the client left, the upstream failed), it
// counts what was produced: a token per delta of content, after the input the stream
// reported or the prompt's estimate. When the body ends or is closed, done gets what the
// answer cost, once; an answer it cannot read (another encoding, not JSON, no usage) says
// nothing (known false), and the estimate stands.
type Meter struct {
	body   io.ReadCloser
	stream bool
	prompt int64 // the input's estimate, for a stream that reports none
	done   func(u Usage, known bool)
	enc    string // the body's Content-Encoding: "" or "gzip"; another one is not read

	inflate *inflater // a stream's bytes on their way through gzip, nil for a plain one

	buf    []byte     // the stream's line in progress, or the JSON body
	large  *largeJSON // a JSON body past maxBody, read as it passes
	skip   bool       // the line in progress is too long to read
	cr     bool       // the last line ended with CR: an LF next is part of its end
	data   []byte     // the data of the event in progress
	input  int64      // reported, for a stream: -1 until then
	output int64      // reported, for a stream (so far, in Anthropic's message_start)
	final  bool       // the stream reported its usage whole: OpenAI's last chunk, Anthropic's message_delta
	deltas int64      // deltas of content streamed
	once   sync.Once
}

// NewMeter is a Meter of body, an answer of a stream of Server-Sent Events (stream) or of
// JSON, whose prompt was estimated at prompt tokens, telling done what it cost. Encoding
// is the answer's Content-Encoding: "" (or "identity") and "gzip" are read; an answer in
// another says nothing of its cost.
func NewMeter(body io.ReadCloser, encoding string, stream bool, prompt int64, done func(u Usage, known bool)) *Meter {
	m := &Meter{body: body, stream: stream, prompt: prompt, done: done, input: -1}
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "", "identity":
	case "gzip", "x-gzip":
		m.enc = "gzip"
		if stream {
			m.inflate = newInflater(m.feedPlain)
		}
	default:
		m.enc = "unknown"
	}
	return m
}

func (m *Meter) Read(p []byte) (int, error) {
	n, err := m.body.Read(p)
	m.feed(p[:n])
	if err != nil {
		m.finish()
	}
	return n, err
}

func (m *Meter) Close() error {
	err := m.body.Close()
	m.finish()
	return err
}

// feed reads the bytes of the answer that passed, as they came.
func (m *Meter) feed(p []byte) {
	switch {
	case m.enc == "unknown":
	case !m.stream:
		switch {
		case m.large != nil:
			m.large.write(p)
		case len(m.buf)+len(p) <= maxBody:
			m.buf = append(m.buf, p...)
		default:
			m.large = newLargeJSON(m.enc == "gzip")
			m.large.write(m.buf)
			m.large.write(p)
			m.buf = nil
		}
	case m.inflate != nil:
		m.inflate.write(p)
	default:
		m.feedPlain(p)
	}
}

// feedPlain reads the bytes of a stream, decoded: its lines, each ended by LF, CRLF or
// CR (Server-Sent Events allows the three).
func (m *Meter) feedPlain(p []byte) {
	if len(p) == 0 { // a read of nothing: a CR before it may still end in an LF after
		return
	}
	if m.cr && p[0] == '\n' { // the LF of a CRLF split across reads
		p = p[1:]
	}
	m.cr = false
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			if len(m.buf)+len(p) > maxLine {
				m.skip, m.buf = true, m.buf[:0]
			} else if !m.skip {
				m.buf = append(m.buf, p...)
			}
			return
		}
		if !m.skip && len(m.buf)+i <= maxLine {
			m.line(append(m.buf, p[:i]...))
		}
		end := i + 1
		if p[i] == '\r' {
			switch {
			case end == len(p):
				m.cr = true
			case p[end] == '\n':
				end++
			}
		}
		m.buf, m.skip, p = m.buf[:0], false, p[end:]
	}
}

// line reads one line of the stream: a field of the event in progress, or the blank line
// that ends it (Server-Sent Events: the data lines of one event, joined by newlines).
func (m *Meter) line(l []byte) {
	if len(l) == 0 {
		m.dispatch()
		return
	}
	if v, ok := bytes.CutPrefix(l, []byte("data:")); ok {
		if len(m.data) > 0 {
			m.data = append(m.data, '\n')
		}
		m.data = append(m.data, bytes.TrimPrefix(v, []byte(" "))...)
	} // event:, id:, retry: and comments say nothing of usage
}

// dispatch reads the event in progress.
func (m *Meter) dispatch() {
	data := m.data
	m.data = m.data[:0]
	if len(data) == 0 || bytes.Equal(data, []byte("[DONE]")) {
		return
	}
	var e event
	if json.Unmarshal(data, &e) != nil {
		return
	}
	if e.produced() {
		m.deltas++
	}
	u := e.usage()
	in, out, ok := u.split()
	if !ok {
		return
	}
	switch e.Type {
	case "message_start": // the input, and the output so far
		m.input, m.output = in, out
	case "message_delta": // the counts so far, cumulative: the output, and the input if it says it
		if u.InputTokens != nil && *u.InputTokens > 0 || m.input < 0 {
			m.input = in
		}
		m.output, m.final = out, true
	case "response.completed", "response.incomplete", "response.failed", "": // the Responses API's end; OpenAI's last chunk
		m.input, m.output, m.final = in, out, true
	}
}

// finish tells done what the answer cost, once: at its end, or when it was closed
// before (a stream cut short).
func (m *Meter) finish() {
	m.once.Do(func() {
		if m.enc == "unknown" {
			m.done(Usage{}, false)
			return
		}
		if !m.stream {
			var u *apiUsage
			switch {
			case m.large != nil:
				u = m.large.close()
			case m.enc == "gzip":
				u = topUsage(bytes.NewReader(m.buf), true) // it may decode past maxBody
			default:
				var e event
				if json.Unmarshal(m.buf, &e) == nil {
					u = e.usage()
				}
			}
			in, out, ok := u.split()
			m.done(Usage{Input: in, Output: out}, ok)
			return
		}
		if m.inflate != nil {
			m.inflate.close() // what it decoded is fed when it returns
		}
		if len(m.buf) > 0 && !m.skip { // a last line without its end
			m.line(m.buf)
		}
		m.dispatch() // an event the stream did not end with a blank line
		u := Usage{Input: m.input, Output: m.output}
		if u.Input < 0 {
			u.Input = m.prompt
		}
		if !m.final { // cut short, or never reported: what was produced
			u.Output = max(u.Output, m.deltas)
		}
		m.done(u, true)
	})
}

// largeJSON reads the usage of a JSON answer too large to hold, as it passes: a
// goroutine walks its top-level object through a pipe (topUsage). A write returns once
// the goroutine took it, or at once after the walk ended.
type largeJSON struct {
	w    *io.PipeWriter
	done chan struct{}
	u    *apiUsage
}

func newLargeJSON(gz bool) *largeJSON {
	r, w := io.Pipe()
	l := &largeJSON{w: w, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.u = topUsage(r, gz)
		r.CloseWithError(io.ErrClosedPipe) // the rest of the answer is not read
	}()
	return l
}

func (l *largeJSON) write(p []byte) { _, _ = l.w.Write(p) }

// close ends the answer, and returns the usage it reported, nil for none.
func (l *largeJSON) close() *apiUsage {
	l.w.Close()
	<-l.done
	return l.u
}

// topUsage is the usage field of the JSON object r holds (gzip-encoded with gz), where
// every API puts it in an answer that is not streamed; nil when it has none, or r is not
// a JSON object. It holds one of the object's values at a time, and skips the others
// token by token.
func topUsage(r io.Reader, gz bool) *apiUsage {
	if gz {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil
		}
		r = zr
	}
	dec := json.NewDecoder(r)
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var found *apiUsage
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil
		}
		if key == "usage" {
			var u apiUsage
			if dec.Decode(&u) != nil {
				return nil
			}
			found = &u
			continue
		}
		for depth := 0; ; { // the value, skipped
			t, err := dec.Token()
			if err != nil {
				return nil
			}
			switch t {
			case json.Delim('{'), json.Delim('['):
				depth++
			case json.Delim('}'), json.Delim(']'):
				depth--
			}
			if depth == 0 {
				break
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the object's end: an answer cut short reports nothing
		return nil
	}
	return found
}

// inflater decodes a gzip stream written to it piece by piece, handing what it decodes
// to out as it goes: compress/gzip reads from an io.Reader, so a goroutine reads the
// pieces through a pipe. A write returns once the goroutine took it.
type inflater struct {
	w    *io.PipeWriter
	done chan struct{}
}

func newInflater(out func([]byte)) *inflater {
	r, w := io.Pipe()
	f := &inflater{w: w, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		defer r.Close()
		zr, err := gzip.NewReader(r)
		if err != nil {
			io.Copy(io.Discard, r) // not gzip: nothing is read, and writes go on
			return
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := zr.Read(buf)
			out(buf[:n])
			if err != nil {
				io.Copy(io.Discard, r)
				return
			}
		}
	}()
	return f
}

// write hands p to the decoder.
func (f *inflater) write(p []byte) {
	if len(p) > 0 {
		f.w.Write(p)
	}
}

// close ends the stream, and returns once every byte written was decoded and handed on.
func (f *inflater) close() {
	f.w.Close()
	<-f.done
}
