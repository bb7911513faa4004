package llmlimit

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
)

// Usage is what a model's answer cost, in tokens.
type Usage struct {
	Input, Output int64
}

// ReadUsage reads the usage of a JSON answer, in either API's format (OpenAI's
// prompt_tokens and completion_tokens, Anthropic's input_tokens, its cached input
// included, and output_tokens); ok false when body reports none.
func ReadUsage(body []byte) (u Usage, ok bool) {
	var e event
	if json.Unmarshal(body, &e) != nil {
		return Usage{}, false
	}
	u.Input, u.Output, ok = e.Usage.split()
	return u, ok
}

// Total is what the answer cost in all.
func (u Usage) Total() int64 { return u.Input + u.Output }

// apiUsage is the usage object of either API's answers: OpenAI's chat completions
// (prompt_tokens, completion_tokens, total_tokens) and Anthropic's messages (input_tokens,
// the cached input apart, and output_tokens).
type apiUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	TotalTokens      *int64 `json:"total_tokens"`

	InputTokens              *int64 `json:"input_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
}

// input and output are the tokens u reports of each (ok false when it reports neither):
// OpenAI's total_tokens, when it says more than its parts, counts as output.
func (u *apiUsage) split() (in, out int64, ok bool) {
	val := func(p *int64) int64 {
		if p == nil || *p < 0 {
			return 0
		}
		return *p
	}
	switch {
	case u == nil:
		return 0, 0, false
	case u.PromptTokens != nil || u.CompletionTokens != nil || u.TotalTokens != nil:
		in, out = val(u.PromptTokens), val(u.CompletionTokens)
		return in, max(out, val(u.TotalTokens)-in), true
	case u.InputTokens != nil || u.OutputTokens != nil:
		in = val(u.InputTokens) + max(0, u.CacheCreationInputTokens) + max(0, u.CacheReadInputTokens)
		return in, val(u.OutputTokens), true
	}
	return 0, 0, false
}

// event is the part of a JSON answer, or of one event of a stream, that a meter reads,
// in either API's format.
type event struct {
	Type    string    `json:"type"` // Anthropic's: message, message_start, content_block_delta, message_delta, ...
	Usage   *apiUsage `json:"usage"`
	Message *struct { // Anthropic's message_start
		Usage *apiUsage `json:"usage"`
	} `json:"message"`
	Choices []struct { // OpenAI's chunks
		Delta *struct {
			Content   *string           `json:"content"`
			ToolCalls []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
}

// maxBody bounds the JSON answers a Meter reads whole for their usage: a larger one is
// passed on, and its usage not read.
const maxBody = 1 << 20

// maxLine bounds a line of a stream the meter holds to parse: a longer one (no model
// sends one) is passed on, and not read.
const maxLine = 1 << 20

// Meter reads a model's answer as it passes to the client: a JSON body whole, or a
// stream of Server-Sent Events event by event. It learns the usage the answer reports
// (OpenAI's last chunk, with stream_options.include_usage; Anthropic's message_start and
// message_delta) and, for a stream that reports none, or is cut before it does (the
// client left, the upstream failed), counts what was produced: a token per delta of
// content, after the input the stream reported or the prompt's estimate. When the body
// ends or is closed, done gets what the answer cost, once; a body that is neither a stream
// nor JSON with a usage says nothing (known false), and the estimate stands.
type Meter struct {
	body   io.ReadCloser
	stream bool
	prompt int64 // the input's estimate, for a stream that reports none
	done   func(u Usage, known bool)

	buf    []byte // the stream's line in progress, or the JSON body
	skip   bool   // the line in progress is too long to read
	data   []byte // the data of the event in progress
	input  int64  // reported, for a stream: -1 until then
	output int64  // reported, for a stream (so far, in Anthropic's message_start)
	final  bool   // the stream reported its usage whole: OpenAI's last chunk, Anthropic's message_delta
	deltas int64  // deltas of content streamed
	once   sync.Once
}

// NewMeter is a Meter of body, an answer of a stream of Server-Sent Events (stream) or of
// JSON, whose prompt was estimated at prompt tokens, telling done what it cost.
func NewMeter(body io.ReadCloser, stream bool, prompt int64, done func(u Usage, known bool)) *Meter {
	return &Meter{body: body, stream: stream, prompt: prompt, done: done, input: -1}
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

// feed reads the bytes of the answer that passed.
func (m *Meter) feed(p []byte) {
	if !m.stream {
		if len(m.buf)+len(p) <= maxBody {
			m.buf = append(m.buf, p...)
		} else {
			m.skip = true
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(m.buf)+len(p) > maxLine {
				m.skip, m.buf = true, m.buf[:0]
			} else if !m.skip {
				m.buf = append(m.buf, p...)
			}
			return
		}
		if !m.skip && len(m.buf)+i <= maxLine {
			m.line(bytes.TrimSuffix(append(m.buf, p[:i]...), []byte("\r")))
		}
		m.buf, m.skip, p = m.buf[:0], false, p[i+1:]
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
	for _, c := range e.Choices {
		if c.Delta != nil && (c.Delta.Content != nil && *c.Delta.Content != "" || len(c.Delta.ToolCalls) > 0) {
			m.deltas++
		}
	}
	if e.Type == "content_block_delta" {
		m.deltas++
	}
	u := e.Usage
	if e.Message != nil && e.Message.Usage != nil {
		u = e.Message.Usage
	}
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
	default: // OpenAI's last chunk
		m.input, m.output, m.final = in, out, true
	}
}

// finish tells done what the answer cost, once: at its end, or when it was closed
// before (a stream cut short).
func (m *Meter) finish() {
	m.once.Do(func() {
		if !m.stream {
			var e event
			if m.skip || json.Unmarshal(m.buf, &e) != nil {
				m.done(Usage{}, false)
				return
			}
			in, out, ok := e.Usage.split()
			m.done(Usage{Input: in, Output: out}, ok)
			return
		}
		if len(m.buf) > 0 && !m.skip { // a last line without its end
			m.line(bytes.TrimSuffix(m.buf, []byte("\r")))
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
