package slidingwindow

import "github.com/ratelimit-go/ratelimit"

// Limiter is a sliding window counter limiter over a Store: two counters per key, all
// under one Rule. Allow, AllowN and the rest are ratelimit.AlgorithmLimiter's. It is safe
// for concurrent use.
type Limiter struct{ ratelimit.AlgorithmLimiter }

// New returns a slidingwindow limiter with rule over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for a rule it cannot enforce, and an error for a nil store.
// Its keys are in the rule's namespace unless ratelimit.WithNamespace names one.
func New(store ratelimit.Store, rule ratelimit.Rule, opts ...ratelimit.Option) (*Limiter, error) {
	l, err := ratelimit.NewAlgorithmLimiter(store, algorithm, rule, opts...)
	if err != nil {
		return nil, err
	}
	return &Limiter{*l}, nil
}
