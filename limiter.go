// Package ratelimit limits how often something may happen, per key. It works in one
// process, or across many that share Redis.
//
// Pick an algorithm package: tokenbucket, fixedwindow, slidingwindow, slidinglog or
// leakybucket. Pick a store: localstore in memory, redisstore on Redis, or fallback for
// both. Then ask the resulting Limiter for a Decision before each event:
//
//	store := localstore.New()
//	limiter, err := tokenbucket.New(store, ratelimit.PerSecond(10), ratelimit.WithNamespace("api"))
//	...
//	d, err := limiter.Allow(ctx, "tenant-42")
//	if err == nil && !d.Allowed {
//		// reject, and tell the client to come back after d.RetryAfter
//	}
//
// A denial is a Decision with Allowed false, never an error. An error is the caller's
// mistake (ErrInvalidRule, ErrInvalidN, ErrDuplicateKey) or a failure of the store's
// backend (ErrUnavailable). Match them with errors.Is.
//
// Limiters on one store count together when they share an algorithm, a namespace and a
// key. By default the namespace is the rule's, so a limiter whose rule changes starts
// every key afresh. Name the namespace with WithNamespace.
//
// Every algorithm's limiter (AlgorithmLimiter) can also decide under a rule chosen per
// call (AllowRule). It can peek, refund and reset a key. AllowAll decides under several
// limits at once, all or none. Wait blocks until a limiter allows. InFlightLimiter bounds
// the requests of a key in progress at once. WithReserves sheds the least important
// requests first under overload (see Priority and WithPriority). Middleware limits
// net/http handlers, with the usual headers. The fixedwindow package's NewQuota counts in
// calendar days, weeks, months or years of a time zone.
//
// # Time
//
// Time has microsecond resolution. It comes from the store: a clock.Clock for
// localstore, and Redis's own clock for redisstore.
//
// A clock that goes back never creates allowance. Nor does it lock a key for the length
// of the step. Say the clock is behind a key's latest instant by less than the key's
// period: clocks a little apart, or a small correction. Then the key decides as at that
// latest instant, and the durations count from the caller's clock. Say it is behind by
// more: a clock stepped forward and back, or a virtual machine resumed. Then the key's
// state moves back by whole periods, to within one period of now. The key waits at most
// one period longer than its rule says. A calendar quota carries
// its count into the window of now. A lease of an in-flight limit never lasts more than
// its duration from now.
//
// Instances whose clocks differ by more than a period may admit more than the rule. Each
// time decisions on a key alternate between them counts as a clock stepped back. See
// redisstore.WithClock.
//
// # Stores
//
// This module's stores are localstore, redisstore and fallback, and hotkey's
// decorators. The contract between limiters, algorithms and stores is internal. Stores
// outside this module are not supported.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Limiter decides whether events for a key may happen now. Implementations are safe for
// concurrent use.
type Limiter interface {
	// Allow is AllowN with n = 1.
	Allow(ctx context.Context, key string) (Decision, error)
	// AllowN admits n events for key, all or none.
	AllowN(ctx context.Context, key string, n int64) (Decision, error)
}

// Decision is the answer to one AllowN.
type Decision struct {
	// Allowed reports whether the n events were admitted, and so counted.
	Allowed bool
	// Limit is the most this key can ever be allowed at once. It is the bucket's
	// capacity, the queue's size, or the window's limit.
	Limit int64
	// Remaining is how many more events would be allowed right now. It is never negative.
	Remaining int64
	// RetryAfter, when denied, is the earliest time from now at which the same request
	// could be allowed. It is rounded up, and 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is the time until the key is back to its full allowance. It is 0 if the
	// key is full.
	ResetAfter time.Duration
	// Delay is how long to wait before going ahead, when a shaping algorithm (the leaky
	// bucket) allowed the events. It makes admitted events leave at an even pace. It is 0
	// otherwise.
	Delay time.Duration
}

// Wait is WaitN with n = 1.
func Wait(ctx context.Context, l Limiter, key string) error {
	return WaitN(ctx, l, key, 1)
}

// WaitN blocks until l allows n events for key and their Delay has passed, or until ctx
// ends. While denied, it sleeps for RetryAfter and asks again. If ctx's deadline comes
// before the next retry, WaitN returns at once, with an error that matches
// context.DeadlineExceeded. An error from the limiter is returned as it is. WaitN sleeps
// in real time, whatever clock the limiter's store uses.
//
// If ctx ends during an admitted request's Delay, the events stay counted.
func WaitN(ctx context.Context, l Limiter, key string, n int64) error {
	if l == nil {
		return errors.New("ratelimit: Wait with a nil Limiter")
	}
	for {
		d, err := l.AllowN(ctx, key, n)
		if err != nil {
			return err
		}
		if d.Allowed {
			return sleep(ctx, d.Delay)
		}
		wait := max(d.RetryAfter, time.Millisecond) // a denial always waits, even from a store that says 0
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return fmt.Errorf("ratelimit: waiting %v for %q would pass the context deadline: %w",
				wait, key, context.DeadlineExceeded)
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
