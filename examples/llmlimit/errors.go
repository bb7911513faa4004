package llmlimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// WriteError answers r with status and message as the API it was sent to answers errors,
// so that its SDK reads them: Anthropic's {"type": "error", "error": {"type", "message"}}
// for its messages (a path of /messages, or an anthropic-version header), and
// OpenAI's {"error": {"message", "type", "param", "code"}} for the others.
func WriteError(w http.ResponseWriter, r *http.Request, status int, message string) {
	var body any
	if anthropic(r) {
		body = map[string]any{"type": "error", "error": map[string]string{"type": anthropicType(status), "message": message}}
	} else {
		typ, code := openAIType(status)
		body = map[string]any{"error": map[string]any{"message": message, "type": typ, "param": nil, "code": code}}
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Header().Del("Content-Encoding")
	w.WriteHeader(status)
	w.Write(b)
}

// KeyError is a Middleware's KeyError: 401 in the API's format, for a request without an
// API key (APIKey's error), or one that did not pass a Gate.
func KeyError(w http.ResponseWriter, r *http.Request, err error) {
	WriteError(w, r, http.StatusUnauthorized, err.Error())
}

// Denied is a Middleware's Denied, for a gateway without a Waiter: 429 in the API's
// format, after the Middleware's headers (Retry-After among them).
func Denied(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
	retryAfter := w.Header().Get("Retry-After")
	if retryAfter == "" {
		retryAfter = strconv.FormatInt(int64((d.RetryAfter+time.Second-1)/time.Second), 10)
	}
	tooMany(w, r, retryAfter)
}

// tooMany answers 429 Too Many Requests in the API's format.
func tooMany(w http.ResponseWriter, r *http.Request, retryAfter string) {
	WriteError(w, r, http.StatusTooManyRequests, "Rate limit reached. Please try again in "+retryAfter+"s.")
}

// anthropic reports whether r was sent to Anthropic's API.
func anthropic(r *http.Request) bool {
	p := strings.TrimSuffix(r.URL.Path, "/")
	return p == "/messages" || strings.HasSuffix(p, "/v1/messages") || strings.Contains(p, "/v1/messages/") || r.Header.Get("Anthropic-Version") != ""
}

// anthropicType is the error type of Anthropic's API for status.
func anthropicType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// openAIType is the error type and code of OpenAI's API for status.
func openAIType(status int) (typ string, code any) {
	switch status {
	case http.StatusUnauthorized:
		return "invalid_request_error", "invalid_api_key"
	case http.StatusRequestEntityTooLarge:
		return "invalid_request_error", "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_exceeded", "rate_limit_exceeded"
	}
	if status >= 500 {
		return "server_error", nil
	}
	return "invalid_request_error", nil
}
