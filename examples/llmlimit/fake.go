package llmlimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// fakeMaxTokens is the completion the fake model gives a request without max_tokens.
const fakeMaxTokens = 256

// FakeModel answers as a model's API would, deterministically, in both formats: OpenAI's
// chat completions (POST /v1/chat/completions) and Anthropic's messages (POST
// /v1/messages), as JSON or, asked to ("stream": true), as Server-Sent Events, a word a
// delta. Its tokens are words: the prompt's, and a completion of up to max_tokens (256
// when not said), as long as the prompt's words times 4 (a long question, a long answer).
// A stream of chat completions reports its usage in a last chunk only when asked to
// (stream_options.include_usage), as OpenAI's does. It is the upstream of
// examples/llmproxy's demo and of tests: a gateway tried without a model's API key.
func FakeModel() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readFake(w, r)
		if !ok {
			return
		}
		in, out := fakeUsage(req)
		usage := map[string]int64{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out}
		if !req.Stream {
			writeJSON(w, map[string]any{"object": "chat.completion",
				"choices": []map[string]any{{"index": 0, "message": map[string]string{"role": "assistant", "content": strings.Repeat("word ", int(out))}}},
				"usage":   usage})
			return
		}
		sse := newSSE(w)
		for range out {
			sse.send("", map[string]any{"object": "chat.completion.chunk",
				"choices": []map[string]any{{"index": 0, "delta": map[string]string{"content": "word "}}}})
		}
		if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
			sse.send("", map[string]any{"object": "chat.completion.chunk", "choices": []any{}, "usage": usage})
		}
		sse.data("", "[DONE]")
	})
	mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readFake(w, r)
		if !ok {
			return
		}
		in, out := fakeUsage(req)
		if !req.Stream {
			writeJSON(w, map[string]any{"type": "message", "role": "assistant",
				"content": []map[string]string{{"type": "text", "text": strings.Repeat("word ", int(out))}},
				"usage":   map[string]int64{"input_tokens": in, "output_tokens": out}})
			return
		}
		sse := newSSE(w)
		sse.send("message_start", map[string]any{"type": "message_start",
			"message": map[string]any{"type": "message", "role": "assistant", "usage": map[string]int64{"input_tokens": in, "output_tokens": 1}}})
		sse.send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]string{"type": "text", "text": ""}})
		for range out {
			sse.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": "word "}})
		}
		sse.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		sse.send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]string{"stop_reason": "end_turn"},
			"usage": map[string]int64{"output_tokens": out}})
		sse.send("message_stop", map[string]any{"type": "message_stop"})
	})
	return mux
}

// readFake reads a request of the fake model, or answers 400.
func readFake(w http.ResponseWriter, r *http.Request) (wire, bool) {
	var req wire
	if err := json.NewDecoder(io.LimitReader(r.Body, DefaultMaxBody)).Decode(&req); err != nil {
		http.Error(w, "a request in JSON, please: "+err.Error(), http.StatusBadRequest)
		return req, false
	}
	return req, true
}

// fakeUsage is the fake model's tokens of req: in and out.
func fakeUsage(req wire) (in, out int64) {
	in = Words(string(req.System))
	for _, m := range req.Messages {
		in += Words(string(m.Content))
	}
	limit := int64(req.MaxTokens)
	if req.MaxCompletionTokens > 0 {
		limit = int64(req.MaxCompletionTokens)
	}
	if limit <= 0 {
		limit = fakeMaxTokens
	}
	return in, min(limit, 4*in)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// sse writes Server-Sent Events, each flushed as it is written.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	return &sse{w: w, rc: http.NewResponseController(w)}
}

// send writes an event of v, as JSON, named name ("" for none).
func (s *sse) send(name string, v any) {
	b, _ := json.Marshal(v)
	s.data(name, string(b))
}

func (s *sse) data(name, data string) {
	if name != "" {
		fmt.Fprintf(s.w, "event: %s\n", name)
	}
	fmt.Fprintf(s.w, "data: %s\n\n", data)
	s.rc.Flush()
}
