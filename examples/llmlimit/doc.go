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
//	policies, err := limits.Policies(store, llmlimit.Options{}) // one store: Redis behind hotkey.Leases, say
//	waiter := &llmlimit.Waiter{Max: 30 * time.Second}
//	mw := &ratelimit.Middleware{
//		Key:      llmlimit.APIKey,
//		Policies: policies,
//		InFlight: inflight, // requests in progress per key
//		Headers:  llmlimit.OpenAIHeaders(),
//		Denied:   waiter.Denied,
//	}
//	gate := &llmlimit.Gate{Waiter: waiter} // reads the request: 413 past 1 MiB
//	http.ListenAndServe(":8081", gate.Wrap(mw.Wrap(llmlimit.Proxy(upstream))))
//
// The pieces stand alone: the usage readers (ReadUsage for a JSON answer, Meter for a
// stream of Server-Sent Events, in OpenAI's and Anthropic's formats) and the header
// writers serve a gateway built otherwise.
//
// # Module
//
// It is a module of its own, github.com/ratelimit-go/ratelimit/examples/llmlimit, beside
// the library's and the examples', so that what a language-model gateway needs never
// enters the library's go.mod (today it needs nothing beyond the standard library and
// the library). It lives in the library's repository and is versioned with it: a
// release of the library tags it too (examples/llmlimit/vX.Y.Z), requiring that very
// release of the library, so that a service pins one version for both. Until then, a
// service uses it at a commit (go get github.com/ratelimit-go/ratelimit/examples/llmlimit@main),
// or copies it: it is a few hundred lines on the library's public API.
package llmlimit
