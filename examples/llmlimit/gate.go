package llmlimit

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// UsageHeader carries the tokens an answer was charged, input and output together: a
// header of a JSON answer, a trailer of a stream. A client gets it only from a Gate whose
// ReportUsage is set.
const UsageHeader = "X-Usage-Total-Tokens"

// DefaultMaxBody is the largest request body a Gate takes when its MaxBody is 0: 1 MiB.
const DefaultMaxBody = 1 << 20

// Gate reads each model request before the limits decide it: it refuses a body over
// MaxBody with 413 (never cut, and nothing charged), parses it (ParseRequest), and puts
// what the limits and the meter need in the request's context (an Exchange). The
// Middleware goes inside it, and Proxy (or a handler that meters its answer) inside the
// Middleware. A POST to a metered endpoint gets 400 when its body is not a JSON object,
// or spells a field the Gate reads otherwise ("Stream", or "ſtream" with a long s): an
// upstream would read it as the Gate cannot. So does a background response of the
// Responses API, whose usage comes after its answer.
type Gate struct {
	// MaxBody bounds a request's body in bytes: DefaultMaxBody when 0.
	MaxBody int64
	// Tokens estimates the tokens of a prompt's text: ApproxTokens when nil.
	Tokens func(text string) int64
	// Waiter, when set, lets a request the limits deny wait for them (see Waiter).
	Waiter *Waiter
	// Endpoints says which requests the Gate serves, by method and path: Endpoint when
	// nil. Any other gets 404 in the API's format, and never reaches the upstream.
	Endpoints func(method, path string) bool
	// ReportUsage, when set, tells the client what each answer was charged, in
	// UsageHeader. By default the client gets what the upstream sent, and nothing the
	// gateway added.
	ReportUsage bool
}

// Exchange is what a gateway knows of one request: what it asked (Request), and, once the
// meter has read the answer, what it cost.
type Exchange struct {
	Request Request
	body    []byte // as the upstream gets it, to send again after a wait

	read   bool // a GET or HEAD: it costs no tokens
	report bool // the client is told the usage (Gate.ReportUsage)
	asked  bool // the gateway asked for a stream's usage: its usage chunk is not the client's

	mu       sync.Mutex
	usage    Usage
	known    bool
	abort    bool        // the answer was cut short: the connection is aborted once it is charged
	answered atomic.Bool // the upstream's answer came (Proxy): an error after it may have cost tokens
	sent     atomic.Bool // the request was written whole to the upstream (Proxy)
}

// Settle records what the answer cost (known false: it said nothing of it, and the
// estimates stand).
func (x *Exchange) Settle(u Usage, known bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.usage, x.known = u, known
}

// Usage is what the answer cost, and whether it is known.
func (x *Exchange) Usage() (Usage, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.usage, x.known
}

type exchangeKey struct{}

// ExchangeOf is r's Exchange, nil for a request that did not pass a Gate.
func ExchangeOf(r *http.Request) *Exchange {
	x, _ := r.Context().Value(exchangeKey{}).(*Exchange)
	return x
}

// Wrap returns next behind the gate.
func (g *Gate) Wrap(next http.Handler) http.Handler {
	limit := g.MaxBody
	if limit <= 0 {
		limit = DefaultMaxBody
	}
	if g.Waiter != nil {
		next = g.Waiter.wrap(next)
	}
	serves := g.Endpoints
	if serves == nil {
		serves = Endpoint
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !serves(r.Method, r.URL.Path) {
			WriteError(w, r, http.StatusNotFound, fmt.Sprintf("%s %s is not served here: only requests whose tokens are metered", r.Method, r.URL.Path))
			return
		}
		if r.ContentLength > limit {
			WriteError(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("a request body of %d bytes: at most %d", r.ContentLength, limit))
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		if err != nil {
			WriteError(w, r, http.StatusBadRequest, "reading the request body: "+err.Error())
			return
		}
		if int64(len(body)) > limit {
			WriteError(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("a request body over %d bytes", limit))
			return
		}
		r.Trailer = nil // a trailer would reach the upstream after the Gate read the request
		if msg := unread(r, body); msg != "" {
			WriteError(w, r, http.StatusBadRequest, msg)
			return
		}
		read := r.Method == http.MethodGet || r.Method == http.MethodHead
		req, sent, err := parseRequest(r.URL.Path, body, g.Tokens)
		if err != nil && !read && Endpoint(r.Method, r.URL.Path) { // the upstream would read it otherwise: its tokens unseen
			WriteError(w, r, http.StatusBadRequest, err.Error())
			return
		}
		x := &Exchange{Request: req, body: sent, report: g.ReportUsage, asked: !bytes.Equal(sent, body),
			read: read}
		r = r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x))
		x.rewind(r)
		next.ServeHTTP(w, r)
		if x.abort {
			panic(http.ErrAbortHandler) // after the Middleware charged what the stream cost
		}
	})
}

// unread says why r, with body, would reach the upstream otherwise than the Gate reads
// it ("" when it would not): a method override, a body in a coding, or a read with a
// body. A protocol upgrade is only offered: Proxy forwards the request without it.
func unread(r *http.Request, body []byte) string {
	switch {
	case r.Header.Get("X-Http-Method-Override") != "" || r.Header.Get("X-Http-Method") != "" || r.Header.Get("X-Method-Override") != "":
		return "a method override is not served here"
	case contentCoding(r.Header) != "":
		return "a request body in JSON, not encoded, please"
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && len(body) > 0:
		return "a " + r.Method + " has no body here"
	}
	return ""
}

// meteredPaths end the paths of the requests whose tokens a Gate and a Meter read.
var meteredPaths = []string{"/chat/completions", "/completions", "/responses", "/embeddings", "/v1/messages"}

// Endpoint reports whether a Gate serves a request by default: a POST of the endpoints
// whose tokens it meters (chat completions, completions, the Responses API, embeddings,
// Anthropic's messages), and a GET of the models, which costs none. Any other request's
// tokens would pass the limits unseen: a batch, a file, an assistant's run, audio. A path
// with a dot segment or an empty one ("/v1/models/../files") is refused: an upstream may
// resolve it to another endpoint.
func Endpoint(method, p string) bool {
	p = strings.TrimSuffix(p, "/")
	if p == "" || path.Clean(p) != p {
		return false
	}
	switch method {
	case http.MethodGet, http.MethodHead:
		return strings.HasSuffix(p, "/models") || strings.Contains(p, "/models/")
	case http.MethodPost:
		for _, m := range meteredPaths {
			if strings.HasSuffix(p, m) || m == "/v1/messages" && p == "/messages" {
				return true
			}
		}
	}
	return false
}

// rewind sets r's body to the exchange's, from its start.
func (x *Exchange) rewind(r *http.Request) {
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(x.body)), int64(len(x.body))
	r.Header.Set("Content-Length", strconv.Itoa(len(x.body)))
}

// Proxy is a reverse proxy to upstream that meters its answers (see Meter) for the
// Exchange of their request: a JSON answer's usage is in UsageHeader, a stream's in a
// trailer of that name; a stream cut short (the client left, the upstream failed) is
// charged what it produced, and its connection aborted after the charge. An answer ends
// (its last chunk) only once the Middleware around Proxy has charged it, so that a
// client's next request is decided on what this one cost.
func Proxy(upstream *url.URL) http.Handler {
	rp := httputil.NewSingleHostReverseProxy(upstream)
	direct := rp.Director
	rp.Director = func(r *http.Request) {
		direct(r)
		MeteredEncoding(r.Header)
		r.Header.Del("Upgrade") // no tunnel of requests the Gate never sees: an upgrade is an offer, declined
	}
	rp.Transport = sentTracker{http.DefaultTransport}
	rp.ModifyResponse = func(resp *http.Response) error {
		if x := ExchangeOf(resp.Request); x != nil {
			x.answered.Store(true)
		}
		return MeterResponse(resp)
	}
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		x := ExchangeOf(r)
		switch {
		case x != nil && x.answered.Load(): // its answer could not be read: the estimates stand
			WriteError(w, r, http.StatusBadGateway, "the upstream's answer could not be read: "+err.Error())
		case x != nil && !x.sent.Load(): // it never got the request (no connection, no TLS): it bills nothing
			x.Settle(Usage{}, true)
			fallthrough
		default: // the client left, or the upstream failed with the request: the estimates stand
			WriteError(w, r, http.StatusBadGateway, "the upstream did not answer: "+err.Error())
		}
	}
	return recoverAbort(no1xx(rp))
}

// sentTracker is a RoundTripper that marks an Exchange's request sent once it is
// written whole to the upstream: one never sent (its connection or its TLS handshake
// failed, or the client left first) costs nothing.
type sentTracker struct{ next http.RoundTripper }

func (s sentTracker) RoundTrip(r *http.Request) (*http.Response, error) {
	if x := ExchangeOf(r); x != nil {
		r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
			WroteRequest: func(w httptrace.WroteRequestInfo) {
				if w.Err == nil {
					x.sent.Store(true)
				}
			},
		}))
	}
	return s.next.RoundTrip(r)
}

// no1xx passes no informational answer (103 Early Hints) of the upstream on: the reverse
// proxy writes one with the answer's header, which holds the Middleware's rate-limit
// headers, and then clears it, so that the final answer went without them.
func no1xx(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&finalOnly{ResponseWriter: w, kept: w.Header().Clone()}, r)
	})
}

// finalOnly is a ResponseWriter that drops 1xx answers, and keeps its header as it was
// before one.
type finalOnly struct {
	http.ResponseWriter
	kept    http.Header // the header before any 1xx
	cleared bool        // a 1xx was dropped: the header is restored at its next use
}

func (f *finalOnly) Header() http.Header {
	h := f.ResponseWriter.Header()
	if f.cleared {
		f.cleared = false
		clear(h)
		for k, v := range f.kept {
			h[k] = v
		}
	}
	return h
}

func (f *finalOnly) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		f.cleared = true
		return
	}
	f.ResponseWriter.WriteHeader(code)
}

func (f *finalOnly) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// MeteredEncoding leaves in h, a request's header on its way upstream, only the content
// coding a Meter reads: gzip when the client accepts it, else none (Go's Transport then
// asks for gzip itself, and decodes the answer before the meter and the client see it).
// An answer in a coding the meter cannot read would be charged its estimate only.
func MeteredEncoding(h http.Header) {
	accepts := false
	for _, v := range h.Values("Accept-Encoding") {
		for _, c := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(c), ";")
			coding = strings.ToLower(strings.TrimSpace(coding))
			if (coding == "gzip" || coding == "x-gzip" || coding == "*") && !zeroQ(params) {
				accepts = true
			}
		}
	}
	h.Del("Accept-Encoding")
	if accepts {
		h.Set("Accept-Encoding", "gzip")
	}
}

// zeroQ reports whether params, a coding's parameters in Accept-Encoding, say q=0: not
// acceptable.
func zeroQ(params string) bool {
	for _, p := range strings.Split(params, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(strings.TrimSpace(k), "q") {
			if q, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && q == 0 {
				return true
			}
		}
	}
	return false
}

// MeterResponse meters resp, an answer of the upstream to a request through a Gate, for
// its Exchange: httputil.ReverseProxy's ModifyResponse. An error (a status of 400 or
// more), a redirect or an answer of no content costs no tokens, as the providers bill
// none; another answer that is not 200 says nothing of its cost, and the estimates
// stand. The upstream's own rate-limit headers are taken out: the client reads the
// gateway's, once each.
func MeterResponse(resp *http.Response) error {
	x := ExchangeOf(resp.Request)
	if x == nil {
		return nil
	}
	dropRateLimitHeaders(resp.Header)
	defer func() { resp.Body = &dropTrailers{ReadCloser: resp.Body, resp: resp} }() // they come at the body's end
	switch {
	case resp.StatusCode == http.StatusSwitchingProtocols: // never asked for
		return errors.New("the upstream switched protocols unasked")
	case resp.StatusCode >= http.StatusBadRequest, resp.StatusCode == http.StatusNoContent,
		resp.StatusCode >= http.StatusMultipleChoices && resp.StatusCode < http.StatusBadRequest:
		x.Settle(Usage{}, true)
		return nil
	case resp.StatusCode != http.StatusOK:
		return nil
	}
	media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch media {
	case "text/event-stream": // read as it streams; the tokens in a trailer at its end
		if x.report {
			if resp.Trailer == nil {
				resp.Trailer = http.Header{}
			}
			resp.Trailer[UsageHeader] = nil // announced: the reverse proxy sends it after the body
		}
		encoding := contentCoding(resp.Header)
		if x.asked && isGzip(encoding) { // decoded for the client, so that the usage chunk can be taken out
			resp.Body = struct {
				io.Reader
				io.Closer
			}{&gunzip{src: resp.Body}, resp.Body}
			encoding = ""
			resp.Header.Del("Content-Encoding")
			resp.Header.Del("Content-Length")
			resp.ContentLength = -1
		}
		m := NewMeter(resp.Body, encoding, true, x.Request.Input, func(u Usage, known bool) {
			x.Settle(u, known)
			if known && x.report {
				resp.Trailer.Set(UsageHeader, strconv.FormatInt(u.Total(), 10))
			}
		})
		resp.Body = m
		if x.asked && encoding == "" { // shorter than the upstream's
			resp.Body = newUsageDropper(m)
		}
		// Without a length, the answer ends with the proxy's handler, after the Middleware
		// charged it (and its trailer can be sent): a client that has it whole is decided
		// on what it cost. With the upstream's length, it had the last byte first.
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	case "application/json": // read whole, for the tokens in a header
		m := NewMeter(resp.Body, contentCoding(resp.Header), false, x.Request.Input, x.Settle)
		body, err := io.ReadAll(io.LimitReader(m, maxBody+1))
		if err != nil {
			m.Close()
			return err
		}
		if len(body) > maxBody { // too large to read whole: passed on, its usage unread
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(body), m), m}
			return nil
		}
		m.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if u, known := x.Usage(); known && x.report {
			resp.Header.Set(UsageHeader, strconv.FormatInt(u.Total(), 10))
		}
		// Without a length, the answer ends with the proxy's handler, after the Middleware
		// charged it: a client that sends its next request once it has this one whole is
		// decided on what this one cost, as its headers and UsageHeader said.
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	return nil
}

// contentCoding is the coding of an answer whose header is h: "" for none (identity),
// "gzip", or the codings as they came when there are several or one the meter cannot
// read (charged the estimate). Every line of Content-Encoding counts.
func contentCoding(h http.Header) string {
	var codings []string
	for _, v := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	return strings.Join(codings, ", ")
}

// dropRateLimitHeaders takes out of h, an upstream's answer's header, the headers of
// rate limits, which the gateway writes its own of: OpenAI's, Anthropic's and the IETF
// draft's. Beside the gateway's, a client read two values ("60, 10000") it could not
// parse.
func dropRateLimitHeaders(h http.Header) {
	for k := range h {
		switch l := strings.ToLower(k); {
		case strings.HasPrefix(l, "x-ratelimit-"), strings.HasPrefix(l, "anthropic-ratelimit-"),
			l == "ratelimit", l == "ratelimit-policy", l == "ratelimit-limit", l == "ratelimit-remaining", l == "ratelimit-reset":
			delete(h, k)
		}
	}
}

// gunzip decodes src from gzip, from its first read: the answer's status and headers
// reach the client before the stream's first bytes (a gzip reader made at once waits for
// them), and an empty stream is an empty answer.
type gunzip struct {
	src io.Reader
	z   *gzip.Reader
}

func (g *gunzip) Read(p []byte) (int, error) {
	if g.z == nil {
		z, err := gzip.NewReader(g.src)
		if err != nil {
			return 0, err
		}
		g.z = z
	}
	return g.z.Read(p)
}

// dropTrailers reads an answer's body, and takes the upstream's rate-limit trailers out
// once they came, at its end.
type dropTrailers struct {
	io.ReadCloser
	resp *http.Response
}

func (d *dropTrailers) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	if err == io.EOF {
		dropRateLimitHeaders(d.resp.Trailer)
	}
	return n, err
}

// recoverAbort takes the reverse proxy's abort of an answer cut short
// (http.ErrAbortHandler) as the end of the answer, so that the Middleware charges what it
// cost; the Gate aborts the connection after.
func recoverAbort(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				x := ExchangeOf(r)
				if v != http.ErrAbortHandler || x == nil {
					panic(v)
				}
				x.abort = true
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// APIKey is a request's API key, as the providers take it: Anthropic's x-api-key, a
// bearer token (OpenAI's Authorization, its scheme in any case), Azure's api-key,
// Google's x-goog-api-key, or a key, api-key or api_key query parameter. A Middleware's
// Key. A request that names two different keys, in one place or in several, is an
// error: the limits would count one while the upstream bills another.
func APIKey(r *http.Request) (string, error) {
	var keys []string
	add := func(k string) {
		if k = strings.TrimSpace(k); k != "" && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for _, h := range []string{"X-Api-Key", "Api-Key", "X-Goog-Api-Key"} {
		for _, v := range r.Header.Values(h) {
			add(v)
		}
	}
	for _, v := range r.Header.Values("Authorization") {
		if f := strings.Fields(v); len(f) == 2 && strings.EqualFold(f[0], "Bearer") {
			add(f[1])
		} else if len(f) > 0 && strings.EqualFold(f[0], "Bearer") {
			return "", errors.New("an Authorization header of a bearer token, please: Bearer <key>")
		}
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil { // a ';' the upstream may read a key after
		return "", fmt.Errorf("a query the gateway cannot read: %w", err)
	}
	for _, p := range []string{"key", "api-key", "api_key"} {
		for _, v := range q[p] {
			add(v)
		}
	}
	switch len(keys) {
	case 0:
		return "", errors.New("an API key is required: Authorization: Bearer <key>, or X-Api-Key")
	case 1:
		return keys[0], nil
	}
	return "", fmt.Errorf("%d different API keys in one request: the headers and the query must name one", len(keys))
}
