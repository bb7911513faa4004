package llmlimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
)

// fakeMaxTokens is the completion the fake model gives a request without max_tokens.
const fakeMaxTokens = 256

// fakeCreated is the time every answer of the fake model says it was made: 2026-01-01,
// so that an answer is the same in every run.
const fakeCreated = 1767225600

// FakeModel answers as a model's API would, deterministically, in the APIs' documented
// formats: OpenAI's chat completions (POST /v1/chat/completions), completions (POST
// /v1/completions), Responses API (POST /v1/responses), embeddings (POST /v1/embeddings)
// and models (GET /v1/models), and Anthropic's messages (POST /v1/messages). It answers JSON or, when asked to ("stream": true), Server-Sent Events,
// a word a delta, with the events and fields each API sends. Its tokens are words: the
// prompt's, and a completion of up to max_tokens (256 when not said), as long as the
// prompt's words times 4. A stream of chat completions or completions reports its usage
// in a last chunk only when asked to (stream_options.include_usage), as OpenAI's does.
// It is the upstream of examples/llmproxy's demo and of tests: a gateway tried without a
// model's API key. A Gate estimates prompts as the fake counts them with Tokens: Words.
func FakeModel() http.Handler {
	var seq atomic.Int64 // the answers' ids
	id := func(prefix string) string { return fmt.Sprintf("%s%024d", prefix, seq.Add(1)) }
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readFake(w, r)
		if !ok {
			return
		}
		in, out, stop := fakeUsage(req)
		finish := map[bool]string{true: "stop", false: "length"}[stop]
		usage := map[string]any{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out,
			"prompt_tokens_details":     map[string]int64{"cached_tokens": 0, "audio_tokens": 0},
			"completion_tokens_details": map[string]int64{"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}
		base := func(object string) map[string]any {
			return map[string]any{"id": id("chatcmpl-"), "object": object, "created": fakeCreated, "model": string(req.Model),
				"service_tier": "default", "system_fingerprint": "fp_fake"}
		}
		if !req.Stream {
			a := base("chat.completion")
			a["choices"] = []any{map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish,
				"message": map[string]any{"role": "assistant", "content": fakeWords(out), "refusal": nil, "annotations": []any{}}}}
			a["usage"] = usage
			writeJSON(w, a)
			return
		}
		withUsage := req.StreamOptions != nil && bool(req.StreamOptions.IncludeUsage)
		sse, chunk := newSSE(w), base("chat.completion.chunk")
		send := func(choices []any, u any) {
			chunk["choices"] = choices
			if withUsage {
				chunk["usage"] = u
			}
			sse.send("", chunk)
		}
		delta := func(d map[string]any, finish any) []any {
			return []any{map[string]any{"index": 0, "delta": d, "logprobs": nil, "finish_reason": finish}}
		}
		send(delta(map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil), nil)
		for range out {
			send(delta(map[string]any{"content": "word "}, nil), nil)
		}
		send(delta(map[string]any{}, finish), nil)
		if withUsage {
			send([]any{}, usage)
		}
		sse.data("", "[DONE]")
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readFake(w, r)
		if !ok {
			return
		}
		in, out, stop := fakeUsage(req)
		finish := map[bool]string{true: "stop", false: "length"}[stop]
		usage := map[string]int64{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out}
		a := map[string]any{"id": id("cmpl-"), "object": "text_completion", "created": fakeCreated, "model": string(req.Model),
			"system_fingerprint": "fp_fake"}
		choice := func(text string, finish any) []any {
			return []any{map[string]any{"text": text, "index": 0, "logprobs": nil, "finish_reason": finish}}
		}
		if !req.Stream {
			a["choices"], a["usage"] = choice(fakeWords(out), finish), usage
			writeJSON(w, a)
			return
		}
		sse := newSSE(w)
		for i := range out {
			a["choices"] = choice("word ", map[bool]any{true: finish, false: nil}[i == out-1])
			sse.send("", a)
		}
		if req.StreamOptions != nil && bool(req.StreamOptions.IncludeUsage) {
			a["choices"], a["usage"] = []any{}, usage
			sse.send("", a)
		}
		sse.data("", "[DONE]")
	})
	mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readFake(w, r)
		if !ok {
			return
		}
		in, out, stop := fakeUsage(req)
		respID, msgID := id("resp_"), id("msg_")
		response := func(status string, output []any, usage any) map[string]any {
			a := map[string]any{"id": respID, "object": "response", "created_at": fakeCreated, "status": status,
				"model": string(req.Model), "output": output, "usage": usage, "error": nil, "incomplete_details": nil,
				"instructions": nil, "max_output_tokens": nil, "parallel_tool_calls": true, "previous_response_id": nil,
				"reasoning": map[string]any{"effort": nil, "summary": nil}, "store": true, "temperature": 1.0,
				"text": map[string]any{"format": map[string]string{"type": "text"}}, "tool_choice": "auto", "tools": []any{},
				"top_p": 1.0, "truncation": "disabled", "user": nil, "metadata": map[string]string{}}
			if string(req.Instructions) != "" {
				a["instructions"] = string(req.Instructions)
			}
			if req.MaxOutputTokens > 0 {
				a["max_output_tokens"] = int64(req.MaxOutputTokens)
			}
			if status == "incomplete" {
				a["incomplete_details"] = map[string]string{"reason": "max_output_tokens"}
			}
			return a
		}
		status := map[bool]string{true: "completed", false: "incomplete"}[stop]
		usage := map[string]any{"input_tokens": in, "input_tokens_details": map[string]int64{"cached_tokens": 0},
			"output_tokens": out, "output_tokens_details": map[string]int64{"reasoning_tokens": 0}, "total_tokens": in + out}
		part := func(text string) map[string]any {
			return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
		}
		item := func(status string, content []any) map[string]any {
			return map[string]any{"type": "message", "id": msgID, "status": status, "role": "assistant", "content": content}
		}
		done := item("completed", []any{part(fakeWords(out))})
		if !req.Stream {
			writeJSON(w, response(status, []any{done}, usage))
			return
		}
		sse, n := newSSE(w), 0
		event := func(kind string, fields map[string]any) {
			fields["type"], fields["sequence_number"] = kind, n
			n++
			sse.send(kind, fields)
		}
		event("response.created", map[string]any{"response": response("in_progress", []any{}, nil)})
		event("response.in_progress", map[string]any{"response": response("in_progress", []any{}, nil)})
		event("response.output_item.added", map[string]any{"output_index": 0, "item": item("in_progress", []any{})})
		event("response.content_part.added", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part("")})
		for range out {
			event("response.output_text.delta", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "delta": "word "})
		}
		event("response.output_text.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "text": fakeWords(out)})
		event("response.content_part.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part(fakeWords(out))})
		event("response.output_item.done", map[string]any{"output_index": 0, "item": done})
		event("response."+status, map[string]any{"response": response(status, []any{done}, usage)})
	})
	mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readFake(w, r)
		if !ok {
			return
		}
		in, out, stop := fakeUsage(req)
		reason := map[bool]string{true: "end_turn", false: "max_tokens"}[stop]
		message := func(content []any, reason any, usage map[string]int64) map[string]any {
			return map[string]any{"id": id("msg_"), "type": "message", "role": "assistant", "model": string(req.Model),
				"content": content, "stop_reason": reason, "stop_sequence": nil, "usage": usage}
		}
		usage := func(out int64) map[string]int64 {
			return map[string]int64{"input_tokens": in, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": out}
		}
		if !req.Stream {
			writeJSON(w, message([]any{map[string]string{"type": "text", "text": fakeWords(out)}}, reason, usage(out)))
			return
		}
		sse := newSSE(w)
		sse.send("message_start", map[string]any{"type": "message_start", "message": message([]any{}, nil, usage(1))})
		sse.send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]string{"type": "text", "text": ""}})
		sse.send("ping", map[string]any{"type": "ping"})
		for range out {
			sse.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": "word "}})
		}
		sse.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		sse.send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": reason, "stop_sequence": nil},
			"usage": map[string]int64{"output_tokens": out}})
		sse.send("message_stop", map[string]any{"type": "message_stop"})
	})
	mux.HandleFunc("POST /v1/embeddings", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, DefaultMaxBody))
		var req struct {
			Model text            `json:"model"`
			Input json.RawMessage `json:"input"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			WriteError(w, r, http.StatusBadRequest, "a request in JSON, please: "+err.Error())
			return
		}
		var inputs []json.RawMessage // one embedding an input: a string, or tokens
		if json.Unmarshal(req.Input, &inputs) != nil || len(inputs) > 0 && inputs[0][0] != '"' && inputs[0][0] != '[' {
			inputs = []json.RawMessage{req.Input} // one string, or one array of tokens
		}
		var data []any
		in := int64(0)
		for i, x := range inputs {
			var tokens []int64
			if json.Unmarshal(x, &tokens) == nil {
				in += int64(len(tokens))
			} else {
				in += Words(contentText(x, 0))
			}
			data = append(data, map[string]any{"object": "embedding", "index": i, "embedding": []float64{0.25, -0.5, 0.75}})
		}
		writeJSON(w, map[string]any{"object": "list", "model": string(req.Model), "data": data,
			"usage": map[string]int64{"prompt_tokens": in, "total_tokens": in}})
	})
	model := func(id string) map[string]any {
		return map[string]any{"id": id, "object": "model", "created": fakeCreated, "owned_by": "fake"}
	}
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"object": "list", "data": []any{model("fake-1")}})
	})
	mux.HandleFunc("GET /v1/models/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, model(r.PathValue("id")))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern == "" { // 404 and 405 in the API's format, not text
			WriteError(w, r, http.StatusNotFound, fmt.Sprintf("%s %s: no such endpoint", r.Method, r.URL.Path))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// readFake reads a request of the fake model, or answers 400 in its API's format.
func readFake(w http.ResponseWriter, r *http.Request) (wire, bool) {
	var req wire
	if err := json.NewDecoder(io.LimitReader(r.Body, DefaultMaxBody)).Decode(&req); err != nil {
		WriteError(w, r, http.StatusBadRequest, "a request in JSON, please: "+err.Error())
		return req, false
	}
	return req, true
}

// fakeUsage is the fake model's tokens of req, in and out, and whether the completion
// stopped on its own (stop) rather than at the request's limit.
func fakeUsage(req wire) (in, out int64, stop bool) {
	for _, c := range []content{req.System, req.Instructions, req.Input, req.Prompt} {
		in += Words(string(c))
	}
	for _, m := range req.Messages {
		in += Words(string(m.Content))
	}
	limit := int64(fakeMaxTokens)
	for _, n := range []count{req.MaxTokens, req.MaxCompletionTokens, req.MaxOutputTokens} {
		if n > 0 {
			limit = int64(n)
		}
	}
	return in, min(limit, 4*in), 4*in <= limit
}

// fakeWords is n of the fake model's words.
func fakeWords(n int64) string { return strings.Repeat("word ", int(n)) }

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
