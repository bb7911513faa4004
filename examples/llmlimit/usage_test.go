package llmlimit

import (
	"math"
	"testing"
)

// TestReadUsage: a JSON answer's usage in every format (chat completions, the Responses
// API, Anthropic's messages), OpenAI's total beyond its parts counted as output,
// Anthropic's cached input counted as input; none without a usage, or with a count below
// 0 (unknown: the estimate stands, where a 0 would refund it); sums past int64 stop there.
func TestReadUsage(t *testing.T) {
	const most = math.MaxInt64
	for _, c := range []struct {
		body string
		want Usage
		ok   bool
	}{
		{`{"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`, Usage{12, 30}, true},
		{`{"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":50}}`, Usage{12, 38}, true}, // reasoning tokens in the total only
		{`{"type":"message","usage":{"input_tokens":7,"cache_read_input_tokens":100,"cache_creation_input_tokens":3,"output_tokens":40}}`, Usage{110, 40}, true},
		{`{"usage":{"input_tokens":-5,"output_tokens":2}}`, Usage{}, false},
		{`{"object":"response","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"total_tokens":123}}`, Usage{36, 87}, true},
		{`{"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775807}}`, Usage{most, most}, true},
		{`{"type":"message","usage":{"input_tokens":9223372036854775807,"cache_read_input_tokens":9223372036854775807,"output_tokens":1}}`, Usage{most, 1}, true},
		{`{"usage":{"prompt_tokens":30.0,"completion_tokens":2e1}}`, Usage{30, 20}, true}, // a writer of floats
		{`{"usage":{"prompt_tokens":30.5,"completion_tokens":2}}`, Usage{}, false},
		{`{"usage":{"prompt_tokens":1e30,"completion_tokens":2}}`, Usage{}, false},
		{`{"choices":[]}`, Usage{}, false},
		{`not json`, Usage{}, false},
	} {
		if got, ok := ReadUsage([]byte(c.body)); got != c.want || ok != c.ok {
			t.Errorf("%s: %+v, %v; want %+v, %v", c.body, got, ok, c.want, c.ok)
		}
		if got, _ := ReadUsage([]byte(c.body)); got.Total() < 0 {
			t.Errorf("%s: a total of %d", c.body, got.Total())
		}
	}
}

// TestEstimates: the prompt estimated as OpenAI's rule of thumb has it (four characters
// a token, rounded up) or a token a word; max_completion_tokens before max_tokens.
func TestEstimates(t *testing.T) {
	body := []byte(`{"model":"m","max_tokens":10,"max_completion_tokens":20,"system":"be brief","messages":[{"content":"hello there"},{"content":[{"type":"text","text":"and you"},{"type":"image"}]}]}`)
	if req, _ := ParseRequest("/v1/chat/completions", body, nil); req != (Request{Model: "m", MaxTokens: 20, Input: 2 + 3 + 2}) {
		t.Errorf("approximate: %+v", req)
	}
	if req, _ := ParseRequest("/v1/messages", body, Words); req.Input != 2+2+2 {
		t.Errorf("words: %+v", req)
	}
	if req, out := ParseRequest("/v1/chat/completions", []byte("{bad"), nil); req != (Request{}) || string(out) != "{bad" {
		t.Errorf("a body that is not a request: %+v, %q; want an empty Request and the body as it came", req, out)
	}
}

// TestParseLenient: a body whose fields have types no API sends is read as what they
// spell, never as a body that is not a request (which the Gate limits as the default
// model, escaping its own); and the prompts of the Responses API and legacy completions
// count.
func TestParseLenient(t *testing.T) {
	for _, c := range []struct {
		body string
		want Request
	}{
		{`{"model":"strict","max_tokens":1e1}`, Request{Model: "strict", MaxTokens: 10}},
		{`{"model":"strict","max_tokens":10.0}`, Request{Model: "strict", MaxTokens: 10}},
		{`{"model":"strict","max_tokens":9.2}`, Request{Model: "strict", MaxTokens: 10}},
		{`{"model":"strict","max_tokens":"10"}`, Request{Model: "strict", MaxTokens: 10}},
		{`{"model":"strict","max_tokens":1e400}`, Request{Model: "strict", MaxTokens: math.MaxInt64}},
		{`{"model":"strict","max_tokens":-5,"stream":"true"}`, Request{Model: "strict", Stream: true}},
		{`{"model":"strict","stream":null,"max_tokens":null}`, Request{Model: "strict"}},
		{`{"model":"strict","messages":[{"content":7}]}`, Request{Model: "strict"}},
		{`{"model":5,"max_tokens":3}`, Request{MaxTokens: 3}},
		{`{"model":"r","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hello there"}]},{"role":"user","content":"and you"}],"max_output_tokens":20}`, Request{Model: "r", MaxTokens: 20, Input: 2 + 2 + 2}},
		{`{"model":"c","prompt":["one two","three"],"max_tokens":4}`, Request{Model: "c", MaxTokens: 4, Input: 3}},
	} {
		if got, _ := ParseRequest("/v1/chat/completions", []byte(c.body), Words); got != c.want {
			t.Errorf("%s: %+v; want %+v", c.body, got, c.want)
		}
	}
}
