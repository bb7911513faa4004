// Package fast is what this module's own algorithms, stores and limiters pass between
// them on the way of a decision in place of a ratelimit.Decision, which third parties
// never see: the contract of package ratelimit is all a third party needs, and this is
// only faster.
//
// Go returns a struct of more than four words through memory. A Decision is six: the
// caller stores the result registers one by one and then copies the struct with 16-byte
// loads, which the processor cannot forward from the 8-byte stores just made, so it
// waits for them to reach the cache. An Outcome is four words and comes back in
// registers; on the way from an algorithm's step to the caller of AllowN a Decision
// crossed two such copies, a good part of an in-memory decision's time. The step and
// the store's take return an Outcome; the limiter builds the Decision in its own return
// statement.
package fast

import "time"

// Outcome is a Decision without its Limit, which the rule sets, and with one wait for
// RetryAfter and Delay, of which a Decision has only one.
type Outcome struct {
	Allowed   bool
	Remaining int64
	// Wait is the Decision's Delay when allowed, and its RetryAfter when denied.
	Wait       time.Duration
	ResetAfter time.Duration
}

// RetryAfter is the Decision's RetryAfter: Wait when denied, else 0.
func (o Outcome) RetryAfter() time.Duration {
	if o.Allowed {
		return 0
	}
	return o.Wait
}

// Delay is the Decision's Delay: Wait when allowed, else 0.
func (o Outcome) Delay() time.Duration {
	if o.Allowed {
		return o.Wait
	}
	return 0
}
