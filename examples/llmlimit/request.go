package llmlimit

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// Request is what the limits read of a model request before its answer, in either API's
// format: OpenAI's chat completions and Anthropic's messages.
type Request struct {
	// Model is the model the request names ("" when it names none).
	Model string
	// Stream says that the answer is asked for as a stream of Server-Sent Events.
	Stream bool
	// MaxTokens is the completion asked for at most (max_completion_tokens, or
	// max_tokens), 0 when the request says none.
	MaxTokens int64
	// Input is the estimate of the prompt's tokens: the system prompt's and the
	// messages' text, counted by the Gate's Tokens function.
	Input int64
}

// wire is the part of a request body the Gate reads.
type wire struct {
	Model               string    `json:"model"`
	Messages            []message `json:"messages"`
	System              content   `json:"system"` // Anthropic's
	MaxTokens           int64     `json:"max_tokens"`
	MaxCompletionTokens int64     `json:"max_completion_tokens"` // OpenAI's newer name
	Stream              bool      `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type message struct {
	Content content `json:"content"`
}

// content is a message's text: a string, or the text of its parts ({"type": "text",
// "text": ...}), joined by spaces; other parts (images, tool results) count nothing.
type content string

func (c *content) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*c = content(s)
		return nil
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return err
	}
	texts := make([]string, len(parts))
	for i, p := range parts {
		texts[i] = p.Text
	}
	*c = content(strings.Join(texts, " "))
	return nil
}

// ParseRequest reads the body of a request to path, counting the prompt's tokens with
// tokens (ApproxTokens when nil), and returns the body as the upstream gets it: a stream
// in OpenAI's format (a path ending in /chat/completions) asks for its usage in its last
// chunk (stream_options.include_usage), as OpenAI reports it only when asked; any other
// body goes as it came. A body that is not such a request reads as an empty Request.
func ParseRequest(path string, body []byte, tokens func(string) int64) (Request, []byte) {
	if tokens == nil {
		tokens = ApproxTokens
	}
	var w wire
	if json.Unmarshal(body, &w) != nil {
		return Request{}, body
	}
	req := Request{Model: w.Model, Stream: w.Stream, MaxTokens: max(0, w.MaxTokens), Input: tokens(string(w.System))}
	if w.MaxCompletionTokens > 0 {
		req.MaxTokens = w.MaxCompletionTokens
	}
	for _, m := range w.Messages {
		req.Input += tokens(string(m.Content))
	}
	if !w.Stream || !strings.HasSuffix(path, "/chat/completions") || w.StreamOptions != nil && w.StreamOptions.IncludeUsage {
		return req, body
	}
	return req, withUsage(body)
}

// withUsage is body, an OpenAI stream request, asking for its usage; body as it came if
// it cannot be rewritten.
func withUsage(body []byte) []byte {
	var fields map[string]json.RawMessage // the client's fields, kept as they came
	if json.Unmarshal(body, &fields) != nil {
		return body
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := fields["stream_options"]; ok && !bytes.Equal(raw, []byte("null")) {
		if json.Unmarshal(raw, &opts) != nil {
			return body
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	var err error
	if fields["stream_options"], err = json.Marshal(opts); err != nil {
		return body
	}
	out, err := json.Marshal(fields)
	if err != nil {
		return body
	}
	return out
}

// ApproxTokens estimates the tokens of text as OpenAI's rule of thumb does: a token for
// about four characters of English, rounded up.
func ApproxTokens(text string) int64 {
	return int64(utf8.RuneCountInString(text)+3) / 4
}

// Words counts the words of text, a token each: the built-in fake model's count, and a
// closer estimate than ApproxTokens for a model whose tokens are about words.
func Words(text string) int64 { return int64(len(strings.Fields(text))) }
