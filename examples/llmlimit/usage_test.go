package llmlimit

import "testing"

// TestReadUsage: a JSON answer's usage in either format, OpenAI's total beyond its parts
// counted as output, Anthropic's cached input counted as input; none without a usage.
func TestReadUsage(t *testing.T) {
	for _, c := range []struct {
		body string
		want Usage
		ok   bool
	}{
		{`{"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`, Usage{12, 30}, true},
		{`{"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":50}}`, Usage{12, 38}, true}, // reasoning tokens in the total only
		{`{"type":"message","usage":{"input_tokens":7,"cache_read_input_tokens":100,"cache_creation_input_tokens":3,"output_tokens":40}}`, Usage{110, 40}, true},
		{`{"usage":{"input_tokens":-5,"output_tokens":2}}`, Usage{0, 2}, true},
		{`{"choices":[]}`, Usage{}, false},
		{`not json`, Usage{}, false},
	} {
		if got, ok := ReadUsage([]byte(c.body)); got != c.want || ok != c.ok {
			t.Errorf("%s: %+v, %v; want %+v, %v", c.body, got, ok, c.want, c.ok)
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
