package main

import (
	"bytes"
	"encoding/json"
	"strings"
)

// modelRequest is the part of a request the proxy reads, in either API's format: OpenAI's
// chat completions, Anthropic's messages.
type modelRequest struct {
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

// maxTokens is the completion a request asks for at most, 0 for none said.
func (r modelRequest) maxTokens() int64 {
	if r.MaxCompletionTokens > 0 {
		return r.MaxCompletionTokens
	}
	return max(0, r.MaxTokens)
}

// readRequest reads a request's body, and returns it as the upstream gets it: a stream
// in OpenAI's format (a path ending in /chat/completions) asks for its usage in its last
// chunk (stream_options.include_usage), as OpenAI sends it only when asked; any other
// body goes as it came. A body that is not such a request reads as an empty one.
func readRequest(path string, body []byte) (modelRequest, []byte) {
	var req modelRequest
	if json.Unmarshal(body, &req) != nil {
		return modelRequest{}, body
	}
	if !req.Stream || !strings.HasSuffix(path, "/chat/completions") || req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		return req, body
	}
	var fields map[string]json.RawMessage // the client's fields, kept as they came
	if json.Unmarshal(body, &fields) != nil {
		return req, body
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := fields["stream_options"]; ok && !bytes.Equal(raw, []byte("null")) {
		if json.Unmarshal(raw, &opts) != nil {
			return req, body
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	var err error
	if fields["stream_options"], err = json.Marshal(opts); err != nil {
		return req, body
	}
	out, err := json.Marshal(fields)
	if err != nil {
		return req, body
	}
	return req, out
}

// promptTokens counts a request's prompt as the fake model does: a token a word.
func promptTokens(req modelRequest) int64 {
	n := int64(len(strings.Fields(string(req.System))))
	for _, m := range req.Messages {
		n += int64(len(strings.Fields(string(m.Content))))
	}
	return n
}
