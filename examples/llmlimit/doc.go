// Package llmlimit is what a gateway in front of a language model's API needs around the
// ratelimit library's Middleware: the limits as the providers state them (requests,
// input, output or total tokens a minute, tokens a day, per API key and per model),
// admitted on an estimate read from the request (its prompt and max_tokens) and charged
// the usage the answer reports, JSON or streamed; the rate-limit headers the providers'
// clients already read (OpenAI's x-ratelimit-*, Anthropic's anthropic-ratelimit-*), each
// limit of a request beside the IETF draft's RateLimit-Policy and RateLimit; and
// requests that may wait for their tokens instead of failing.
//
//	limits := llmlimit.Table{"": {RequestsPerMinute: 60, TokensPerMinute: 40_000, TokensPerDay: 1_000_000}}
//	policies, err := limits.Policies(store, llmlimit.Options{}) // one store the instances share: redisstore/fleet
//	waiter := &llmlimit.Waiter{Max: 30 * time.Second}
//	mw := &ratelimit.Middleware{
//		Key:            llmlimit.APIKey,
//		KeyError:       llmlimit.KeyError, // 401 in the API's JSON
//		Policies:       policies,
//		InFlight:       inflight, // requests in progress per key
//		InFlightDenied: llmlimit.Denied,
//		Headers:        llmlimit.OpenAIHeaders(),
//		Denied:         waiter.Denied, // llmlimit.Denied without a Waiter: 429 in the API's JSON
//	}
//	gate := &llmlimit.Gate{Waiter: waiter} // reads the request: 413 past 1 MiB
//	http.ListenAndServe(":8081", gate.Wrap(mw.Wrap(llmlimit.Proxy(upstream))))
//
// The pieces stand alone: the usage readers (ReadUsage for a JSON answer, Meter for a
// stream of Server-Sent Events) and the header writers serve a gateway built otherwise.
//
// # What is metered
//
// The Gate reads OpenAI's chat completions, completions, Responses API and embeddings
// requests, and Anthropic's messages. By default it serves no other request but a GET
// of the models (see Endpoint): another's tokens would pass the limits unseen. A field of
// an unexpected type (a max_tokens of "10") reads as what it spells, or as absent; never
// as another model's request. A body an upstream would read otherwise gets 400: a field
// the Gate reads spelled otherwise or twice, a stream flag not a boolean, a method
// override. A request naming two API keys gets 401. An upgrade a client offers is
// declined.
//
// An error answer of the upstream (400 or more), a redirect, or a request the upstream
// never got costs no tokens. A client that leaves once its request was sent costs its
// estimate. Embeddings are estimated on their input alone, n completions n times. The
// meter reads the usage of any JSON answer, and of streams in each of these formats,
// with LF, CRLF or CR line ends. Proxy asks the upstream for gzip or no compression, and
// the meter reads gzip, so that every answer's usage is seen. A usage count below 0 is
// unknown: the estimate stands.
//
// # What the client gets
//
// The client gets the upstream's answer as it was sent. A chat completions or completions
// stream asks for its usage (stream_options.include_usage) when the client did not. Then
// the chunk of usage, and the "usage": null of the other chunks, are taken out before the
// client reads them; a gzip stream reaches that client decoded. The upstream's own
// rate-limit headers and trailers are replaced by the gateway's, and its 103 Early Hints
// dropped. The tokens an answer was charged reach the client in UsageHeader only when the
// Gate's ReportUsage is set.
//
// # Many instances
//
// Instances that share their limits decide on one store: redisstore/fleet builds it
// (Redis, the fallback's shares while Redis is down, leases, the instance count). Leases
// decide a busy key's requests from memory. A token limit's request asks for thousands of
// events at once, more than an instance admits on trust (hotkey.WithTrust), so it takes
// Redis's round trip unless its key is busy enough to hold a lease: at a provider's
// rates of a few requests a second per key, few are. That round trip, 1-8 ms under load,
// is small beside a model's answer. So a gateway of model requests may set
// fleet.Config.Exact and decide every request on Redis; leases pay for keys that send
// many small requests. A budget charged after the answer is charged once,
// also when Redis answers later than the fallback's timeout.
//
// # Module
//
// It is a module of its own, github.com/ratelimit-go/ratelimit/examples/llmlimit, beside
// the library's and the examples', so that what a language-model gateway needs never
// enters the library's go.mod (today it needs nothing beyond the standard library and
// the library). It lives in the library's repository and moves with it: its go.mod
// requires the library at v0.0.0 and replaces it with the checkout around it (../../),
// so that both are built and tested together at every commit. A release tags both, the
// library vX.Y.Z and this module examples/llmlimit/vX.Y.Z, whose go.mod then requires
// the library's vX.Y.Z without the replace: a service requires the same version of both.
// Before a release, a replace is not followed outside this repository, so a service takes
// the package into its own tree (it is a few files on the library's public API) or
// replaces both modules with a checkout of the repository.
package llmlimit
