package llmlimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Request is what the limits read of a model request before its answer, in any of the
// APIs' formats: OpenAI's chat completions, completions and Responses API, and
// Anthropic's messages.
type Request struct {
	// Model is the model the request names ("" when it names none).
	Model string
	// Stream says that the answer is asked for as a stream of Server-Sent Events.
	Stream bool
	// MaxTokens is the completion asked for at most (max_completion_tokens,
	// max_output_tokens or max_tokens), 0 when the request says none.
	MaxTokens int64
	// Input is the estimate of the prompt's tokens: the text of the system prompt or
	// instructions, the messages, the input or the prompt, counted by the Gate's Tokens
	// function.
	Input int64
	// Embeddings says the request asks for embeddings, which produce no completion: its
	// estimate is its input alone.
	Embeddings bool
	// Choices is how many completions the request asks for (n, or best_of), 0 when it
	// says none (one): each may be max_tokens long.
	Choices int64
}

// wire is the part of a request body the Gate reads. Each field is read on its own, and
// one of a type no API sends (a max_tokens of "10", a stream of "true") reads as the
// value it spells, or as absent: never as a body that is not a request, which would
// escape its model's limits.
type wire struct {
	Model               text      `json:"model"`
	Messages            []message `json:"messages"`
	System              content   `json:"system"`       // Anthropic's
	Instructions        content   `json:"instructions"` // the Responses API's
	Input               content   `json:"input"`        // the Responses API's
	Prompt              content   `json:"prompt"`       // legacy completions'
	MaxTokens           count     `json:"max_tokens"`
	MaxCompletionTokens count     `json:"max_completion_tokens"` // OpenAI's newer name
	MaxOutputTokens     count     `json:"max_output_tokens"`     // the Responses API's
	Stream              flag      `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage flag `json:"include_usage"`
	} `json:"stream_options"`
	Background flag  `json:"background"` // the Responses API's: answered later, its usage unread
	N          count `json:"n"`          // completions asked for
	BestOf     count `json:"best_of"`    // legacy completions': made, of which n are sent
}

type message struct {
	Content content `json:"content"`
}

// text is a string field; anything else reads as "".
type text string

func (t *text) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*t = text(s)
	}
	return nil
}

// count is a count of tokens: a number (1e1 and 10.0 are 10; a fraction rounds up), or
// a string that spells one; anything else, or below 0, reads as 0 (none said).
type count int64

func (c *count) UnmarshalJSON(b []byte) error {
	*c = 0
	var s string
	if json.Unmarshal(b, &s) == nil {
		b = []byte(strings.TrimSpace(s))
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if errors.Is(err, strconv.ErrRange) { // past float64: ±Inf, or a fraction too small
		err = nil
	}
	switch {
	case err != nil || math.IsNaN(f) || f <= 0:
	case f >= math.MaxInt64:
		*c = math.MaxInt64
	default:
		*c = count(math.Ceil(f))
	}
	return nil
}

// flag is a boolean: true, or the string "true" in any case; anything else is false.
type flag bool

func (f *flag) UnmarshalJSON(b []byte) error {
	var v any
	json.Unmarshal(b, &v)
	switch v := v.(type) {
	case bool:
		*f = flag(v)
	case string:
		*f = flag(strings.EqualFold(strings.TrimSpace(v), "true"))
	default:
		*f = false
	}
	return nil
}

// content is a prompt's text: a string, or the text of its parts joined by spaces: parts
// that are strings (a completions prompt's list), {"type": "text", "text": ...}, or items
// with a content of their own (the Responses API's input); other parts (images, tool
// results) count nothing.
type content string

func (c *content) UnmarshalJSON(b []byte) error {
	*c = content(contentText(b, 0))
	return nil
}

// contentText is the text of b, a content in JSON, at a nesting depth.
func contentText(b []byte, depth int) string {
	var s string
	if json.Unmarshal(b, &s) == nil {
		return s
	}
	if depth > 4 {
		return ""
	}
	var parts []json.RawMessage
	if json.Unmarshal(b, &parts) == nil {
		var texts []string
		for _, p := range parts {
			if t := contentText(p, depth+1); t != "" {
				texts = append(texts, t)
			}
		}
		return strings.Join(texts, " ")
	}
	var part struct {
		Text    *string         `json:"text"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(b, &part) != nil {
		return ""
	}
	if part.Text != nil {
		return *part.Text
	}
	if len(part.Content) > 0 {
		return contentText(part.Content, depth+1)
	}
	return ""
}

// ParseRequest reads the body of a request to path, counting the prompt's tokens with
// tokens (ApproxTokens when nil), and returns the body as the upstream gets it: a stream
// in OpenAI's chat completions or completions format asks for its usage in its last chunk
// (stream_options.include_usage), as OpenAI reports it only when asked; any other body
// goes as it came. A body that is not a JSON object reads as an empty Request.
func ParseRequest(path string, body []byte, tokens func(string) int64) (Request, []byte) {
	req, sent, _ := parseRequest(path, body, tokens)
	return req, sent
}

// readFields are the fields of a request the Gate reads, as the APIs spell them; and
// those of its stream_options.
var (
	readFields = []string{"model", "messages", "system", "instructions", "input", "prompt", "max_tokens",
		"max_completion_tokens", "max_output_tokens", "stream", "stream_options", "background", "n", "best_of"}
	streamFields = []string{"include_usage"}
	// the fields of a message, and of a content's part or item, the Gate reads
	messageFields = []string{"content"}
	partFields    = []string{"text", "content"}
)

// parseRequest is ParseRequest, with an error for a body the Gate cannot read as the
// upstream does: not a JSON object, or with a field the Gate reads spelled otherwise
// ("Stream", or "ſtream" with a long s), which encoding/json would take for it and an
// upstream may not; or a request the meter cannot charge (a background response).
func parseRequest(path string, body []byte, tokens func(string) int64) (Request, []byte, error) {
	if tokens == nil {
		tokens = ApproxTokens
	}
	keys, values, err := members(body)
	if err != nil {
		return Request{}, body, err
	}
	if err := spelled(keys, readFields); err != nil {
		return Request{}, body, err
	}
	for i, k := range keys {
		switch k {
		case "stream_options":
			if opts, raw, err := members(values[i]); err == nil {
				if err := spelled(opts, streamFields); err != nil {
					return Request{}, body, err
				}
				for j, o := range opts {
					if o == "include_usage" && !boolean(raw[j]) {
						return Request{}, body, fmt.Errorf("the request's stream_options.include_usage is %s: a boolean, please", raw[j])
					}
				}
			}
		case "stream", "background":
			if !boolean(values[i]) {
				return Request{}, body, fmt.Errorf("the request's %s is %s: a boolean, please", k, values[i])
			}
		case "messages":
			var msgs []json.RawMessage
			if json.Unmarshal(values[i], &msgs) == nil {
				for _, m := range msgs {
					if err := nested(m, messageFields, 0); err != nil {
						return Request{}, body, err
					}
				}
			}
		case "system", "instructions", "input", "prompt":
			if err := nested(values[i], partFields, 0); err != nil {
				return Request{}, body, err
			}
		}
	}
	var w wire
	if err := json.Unmarshal(body, &w); err != nil {
		return Request{}, body, errors.New("the request body is not a JSON object")
	}
	if w.Background {
		return Request{}, body, errors.New("a background response is not served here: its tokens are reported after the answer, where the limits cannot charge them")
	}
	if d, ok := azureDeployment(path); ok { // Azure serves, and bills, the deployment its path names
		w.Model = text(d)
	}
	req := Request{Model: string(w.Model), Stream: bool(w.Stream), MaxTokens: int64(w.MaxTokens),
		Embeddings: strings.HasSuffix(strings.TrimSuffix(path, "/"), "/embeddings"), Choices: int64(max(w.N, w.BestOf))}
	for _, n := range []count{w.MaxOutputTokens, w.MaxCompletionTokens} {
		if n > 0 {
			req.MaxTokens = int64(n)
		}
	}
	for _, c := range []content{w.System, w.Instructions, w.Input, w.Prompt} {
		req.Input += tokens(string(c))
	}
	for _, m := range w.Messages {
		req.Input += tokens(string(m.Content))
	}
	chunks := strings.HasSuffix(strings.TrimSuffix(path, "/"), "/completions") // chat completions' and legacy completions'
	if !req.Stream || !chunks || w.StreamOptions != nil && bool(w.StreamOptions.IncludeUsage) {
		return req, body, nil
	}
	return req, withUsage(body), nil
}

// spelled returns an error for a key of keys that is not one of names but that
// encoding/json would take for one (it matches names without regard to case, as
// Unicode folds it: "Stream", "ſtream"), where an upstream reads keys as they are; and
// for one of names twice, which encoding/json merges (an object) or reads last, where
// an upstream may read only the last (a duplicate stream_options turned the usage off).
func spelled(keys []string, names []string) error {
	seen := map[string]bool{}
	for _, k := range keys {
		if slices.Contains(names, k) {
			if seen[k] {
				return fmt.Errorf("the request's field %q appears twice", k)
			}
			seen[k] = true
			continue
		}
		for _, n := range names {
			if strings.EqualFold(k, n) {
				return fmt.Errorf("the request's field %q: the API's is %q", k, n)
			}
		}
	}
	return nil
}

// azureDeployment is the deployment an Azure OpenAI path names
// (/openai/deployments/{deployment}/...), which Azure serves whatever the body's model.
func azureDeployment(path string) (string, bool) {
	_, rest, ok := strings.Cut(path, "/openai/deployments/")
	if !ok {
		return "", false
	}
	d, _, _ := strings.Cut(rest, "/")
	return d, d != ""
}

// nested returns spelled's error for an object in b, a message or a content, that
// spells a field the Gate reads in it otherwise, or twice ("Content" beside "content"
// hid a prompt of 1,000 words from the estimate); and for the parts and items of its
// content, as deep as contentText reads them.
func nested(b json.RawMessage, names []string, depth int) error {
	if depth > 4 {
		return nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(b, &parts) == nil {
		for _, p := range parts {
			if err := nested(p, partFields, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	keys, values, err := members(b)
	if err != nil {
		return nil // not an object: contentText reads it as it is
	}
	if err := spelled(keys, names); err != nil {
		return err
	}
	for i, k := range keys {
		if k == "content" {
			if err := nested(values[i], partFields, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// members are the keys of a JSON object, in order and as often as they appear, and
// their values.
func members(b []byte) (keys []string, values []json.RawMessage, err error) {
	d := json.NewDecoder(bytes.NewReader(b))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, errors.New("the request body is not a JSON object")
	}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, nil, errors.New("the request body is not a JSON object")
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, nil, errors.New("the request body is not a JSON object")
		}
		keys, values = append(keys, t.(string)), append(values, v)
	}
	return keys, values, nil
}

// boolean reports whether v, a field's JSON value, is what every parser reads alike as
// a boolean: true, false or null, or the string "true" or "false" in any case (read as
// it spells). A lenient upstream reads 1 or "yes" as true, where the Gate would not.
func boolean(v json.RawMessage) bool {
	var x any
	if json.Unmarshal(v, &x) != nil {
		return false
	}
	switch x := x.(type) {
	case nil, bool:
		return true
	case string:
		s := strings.TrimSpace(x)
		return strings.EqualFold(s, "true") || strings.EqualFold(s, "false")
	}
	return false
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
