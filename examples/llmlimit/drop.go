package llmlimit

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strings"
)

// isGzip reports whether a Content-Encoding is gzip.
func isGzip(encoding string) bool {
	e := strings.ToLower(strings.TrimSpace(encoding))
	return e == "gzip" || e == "x-gzip"
}

// usageDropper passes a stream of Server-Sent Events on, event by event, without the
// chunk of usage the gateway asked for (stream_options.include_usage) and the client did
// not: OpenAI's last chunk, whose choices are empty. Every other byte passes as it came.
// An event is held until its blank line, so a client gets it whole, once it is decided;
// one over maxLine bytes is passed on undecided.
type usageDropper struct {
	src     io.ReadCloser
	pending []byte // the event in progress, undecided
	scanned int    // how far into pending lines were looked for
	out     []byte // decided, for the client
	err     error  // src's, once it returned one
	buf     []byte
}

func newUsageDropper(src io.ReadCloser) *usageDropper {
	return &usageDropper{src: src, buf: make([]byte, 32<<10)}
}

func (d *usageDropper) Read(p []byte) (int, error) {
	for len(d.out) == 0 {
		if d.err != nil {
			if len(d.pending) == 0 {
				return 0, d.err
			}
			// the event the stream ended in, without its blank line: decided as the others
			ev := d.pending
			d.pending, d.scanned = nil, 0
			if !addedUsage(ev) {
				d.out = withoutNullUsage(ev)
			}
			continue
		}
		n, err := d.src.Read(d.buf)
		d.pending = append(d.pending, d.buf[:n]...)
		d.err = err
		d.split()
	}
	n := copy(p, d.out)
	d.out = d.out[n:]
	return n, nil
}

func (d *usageDropper) Close() error { return d.src.Close() }

// split moves the events pending holds whole to out, but the usage chunk.
func (d *usageDropper) split() {
	start := 0 // of the event in progress
	line := d.scanned
	for i := d.scanned; i < len(d.pending); i++ {
		c := d.pending[i]
		if c != '\r' && c != '\n' {
			continue
		}
		if c == '\r' && i+1 == len(d.pending) && d.err == nil {
			break // a CR last: its LF may follow
		}
		end := i + 1
		if c == '\r' && end < len(d.pending) && d.pending[end] == '\n' {
			end++
		}
		if i == line { // a blank line: the event ends
			if ev := d.pending[start:end]; !addedUsage(ev) {
				d.out = append(d.out, withoutNullUsage(ev)...)
			}
			start = end
		}
		line, i = end, end-1
	}
	d.pending = d.pending[start:]
	d.scanned = max(0, line-start)
	if len(d.pending) > maxLine { // no event is this long: passed on as it is
		d.out, d.pending, d.scanned = append(d.out, d.pending...), nil, 0
	}
	if len(d.out) == 0 && len(d.pending) == 0 {
		d.pending = nil
	}
}

// nullUsage is the field OpenAI adds to every other chunk of a stream that asked for its
// usage, with the comma that joins it to its neighbour, compact or spaced as JSON
// writers space it.
var nullUsage = func() (forms [][]byte) {
	for _, colon := range []string{":", ": "} {
		for _, comma := range []string{",", ", "} {
			field := `"usage"` + colon + "null"
			forms = append(forms, []byte(comma+field), []byte(field+comma))
		}
	}
	slices.SortStableFunc(forms, func(a, b []byte) int { return len(b) - len(a) }) // the spaces with their field
	return forms
}()

// withoutNullUsage is ev, an event whole, without the null usage the gateway's asking
// added to its data; ev as it came if that is not there once, or if taking it out
// leaves the data no JSON.
func withoutNullUsage(ev []byte) []byte {
	for _, field := range nullUsage {
		if bytes.Count(ev, field) != 1 {
			continue
		}
		out := bytes.Replace(ev, field, nil, 1)
		if json.Valid(eventData(out)) {
			return out
		}
	}
	return ev
}

// eventData is the data of ev, an event whole: its data lines, joined by LF.
func eventData(ev []byte) []byte {
	var data []byte
	first := true
	for _, line := range bytes.FieldsFunc(ev, func(r rune) bool { return r == '\r' || r == '\n' }) {
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v, _ = bytes.CutPrefix(v, []byte(" "))
		if !first {
			data = append(data, '\n')
		}
		data, first = append(data, v...), false
	}
	return data
}

// addedUsage reports whether ev, an event whole, is a chunk of usage only: its data a
// JSON object whose choices are empty and whose usage is not null.
func addedUsage(ev []byte) bool {
	data := eventData(ev)
	var chunk struct {
		Choices *[]json.RawMessage `json:"choices"`
		Usage   json.RawMessage    `json:"usage"`
	}
	if json.Unmarshal(data, &chunk) != nil || chunk.Choices == nil {
		return false
	}
	return len(*chunk.Choices) == 0 && len(chunk.Usage) > 0 && !bytes.Equal(chunk.Usage, []byte("null"))
}
