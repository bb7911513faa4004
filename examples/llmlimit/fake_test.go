package llmlimit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestFakeAsDocumented: each answer of the fake model has the fields of the APIs'
// documented objects, no more and no fewer, of the same JSON types (testdata/documented:
// the objects of OpenAI's and Anthropic's API references, with values of our own); and
// its streams send the documented events in the documented order. Anthropic's SDK threw
// on a message_start without content, id or model, which the fake's own fixtures lacked.
func TestFakeAsDocumented(t *testing.T) {
	for _, c := range []struct{ method, path, body, doc string }{
		{"POST", "/v1/chat/completions", `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"a b"}]}`, "chat.completion.json"},
		{"POST", "/v1/completions", `{"model":"m","max_tokens":3,"prompt":"a b"}`, "text_completion.json"},
		{"POST", "/v1/responses", `{"model":"m","max_output_tokens":3,"input":"a b"}`, "response.json"},
		{"POST", "/v1/embeddings", `{"model":"m","input":"a b"}`, "embeddings.json"},
		{"GET", "/v1/models", ``, "models.json"},
		{"POST", "/v1/messages", `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"a b"}]}`, "message.json"},
	} {
		w := httptest.NewRecorder()
		FakeModel().ServeHTTP(w, httptest.NewRequest(c.method, c.path, strings.NewReader(c.body)))
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %s", c.method, c.path, w.Code, w.Header().Get("Content-Type"))
			continue
		}
		if err := sameShape(decoded(t, w.Body.Bytes()), documented(t, c.doc), "$"); err != nil {
			t.Errorf("%s %s against %s: %v", c.method, c.path, c.doc, err)
		}
	}
}

// TestFakeStreamsAsDocumented: the fake's streams send the documented events, in order
// (a delta repeated as the completion needs), each with the documented fields: Anthropic's
// messages, the Responses API's (its response as the documented object), and chat
// completions' chunks.
func TestFakeStreamsAsDocumented(t *testing.T) {
	for _, c := range []struct{ path, body, doc string }{
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"a b"}]}`, "messages.stream.txt"},
		{"/v1/responses", `{"model":"m","stream":true,"max_output_tokens":100,"input":"a b"}`, "responses.stream.txt"},
	} {
		w := httptest.NewRecorder()
		FakeModel().ServeHTTP(w, httptest.NewRequest("POST", c.path, strings.NewReader(c.body)))
		got, want := events(t, w.Body.String()), events(t, readDoc(t, c.doc))
		var names, wantNames []string
		for _, e := range got {
			if len(names) == 0 || names[len(names)-1] != e.name {
				names = append(names, e.name)
			}
		}
		docs := map[string]any{}
		for _, e := range want {
			wantNames = append(wantNames, e.name)
			docs[e.name] = e.data
		}
		if !slices.Equal(names, wantNames) {
			t.Errorf("%s: events %v; documented %v", c.path, names, wantNames)
		}
		for _, e := range got {
			doc := docs[e.name]
			if d, ok := doc.(map[string]any); ok && d["response"] != nil { // the documented response object
				d["response"] = documented(t, "response.json")
			}
			if err := sameShape(e.data, doc, "$"); err != nil {
				t.Errorf("%s, event %s: %v", c.path, e.name, err)
			}
		}
	}
	w := httptest.NewRecorder()
	FakeModel().ServeHTTP(w, httptest.NewRequest("POST", "/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"a b"}]}`)))
	chunk := documented(t, "chat.completion.chunk.json").(map[string]any)
	for _, e := range events(t, w.Body.String()) {
		if e.done {
			continue
		}
		got := e.data.(map[string]any)
		choices, _ := got["choices"].([]any)
		if len(choices) != 1 {
			t.Fatalf("a chunk of %d choices: %v", len(choices), got)
		}
		choice := choices[0].(map[string]any)
		choice["delta"] = map[string]any{"content": "x"} // the delta's fields change chunk by chunk
		if err := sameShape(got, chunk, "$"); err != nil {
			t.Errorf("a chat completion chunk: %v", err)
		}
	}
}

// sseEvent is one Server-Sent Event: its name, and its data as JSON (done: "[DONE]").
type sseEvent struct {
	name string
	data any
	done bool
}

// events reads the events of a stream.
func events(t *testing.T, stream string) []sseEvent {
	t.Helper()
	var out []sseEvent
	var e sseEvent
	sc := bufio.NewScanner(strings.NewReader(stream))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			e.name = strings.TrimPrefix(line, "event: ")
		case line == "data: [DONE]":
			e.done = true
		case strings.HasPrefix(line, "data: "):
			e.data = decoded(t, []byte(strings.TrimPrefix(line, "data: ")))
		case line == "":
			out = append(out, e)
			e = sseEvent{}
		}
	}
	return out
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/documented/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func documented(t *testing.T, name string) any { return decoded(t, []byte(readDoc(t, name))) }

func decoded(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return v
}

// sameShape returns an error where got and doc differ in shape at path: an object's
// fields (each of doc's, and no other), a value's JSON type, an array's first element.
// A null in either is a field the API may leave null.
func sameShape(got, doc any, path string) error {
	if got == nil || doc == nil {
		return nil
	}
	switch d := doc.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %T; documented an object", path, got)
		}
		for k := range d {
			if _, ok := g[k]; !ok {
				return fmt.Errorf("%s: no %q, a documented field", path, k)
			}
		}
		for k, v := range g {
			dv, ok := d[k]
			if !ok {
				return fmt.Errorf("%s: %q, not a documented field", path, k)
			}
			if err := sameShape(v, dv, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok {
			return fmt.Errorf("%s: %T; documented an array", path, got)
		}
		if len(g) > 0 && len(d) > 0 {
			return sameShape(g[0], d[0], path+"[0]")
		}
	default:
		if fmt.Sprintf("%T", got) != fmt.Sprintf("%T", doc) {
			return fmt.Errorf("%s: %T; documented %T", path, got, doc)
		}
	}
	return nil
}

// TestFakeEmbeddingsAndNotFound: the fake embeds each input (strings or tokens), and
// counts their tokens; a path it does not serve gets 404 in the API's JSON, not text.
func TestFakeEmbeddingsAndNotFound(t *testing.T) {
	for _, c := range []struct {
		input  string
		n      int
		tokens float64
	}{
		{`"a b"`, 1, 2}, {`["a b", "c"]`, 2, 3}, {`[1, 2, 3]`, 1, 3}, {`[[1, 2], [3]]`, 2, 3},
	} {
		w := httptest.NewRecorder()
		FakeModel().ServeHTTP(w, httptest.NewRequest("POST", "/v1/embeddings", strings.NewReader(`{"model":"m","input":`+c.input+`}`)))
		got := decoded(t, w.Body.Bytes()).(map[string]any)
		data, _ := got["data"].([]any)
		usage, _ := got["usage"].(map[string]any)
		if len(data) != c.n || usage["prompt_tokens"] != c.tokens {
			t.Errorf("input %s: %d embeddings, usage %v; want %d, %v tokens", c.input, len(data), usage, c.n, c.tokens)
		}
	}
	for _, path := range []string{"/v1/chat/completions/", "/openai/deployments/d/chat/completions", "/v1/audio/speech"} {
		w := httptest.NewRecorder()
		FakeModel().ServeHTTP(w, httptest.NewRequest("POST", path, strings.NewReader(`{}`)))
		if w.Code != http.StatusNotFound || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s; want 404 in JSON", path, w.Code, w.Header().Get("Content-Type"))
		}
	}
}
