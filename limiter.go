// Package ratelimit limits how often something may happen, per key, in one process or
// across many that share Redis.
//
// Pick an algorithm package (tokenbucket, fixedwindow, slidingwindow, slidinglog,
// leakybucket) and a store (localstore in memory, redisstore on Redis, fallback for both),
// and ask the resulting Limiter for a Decision before each event:
//
//	store := localstore.New()
//	limiter, err := tokenbucket.New(store, ratelimit.PerSecond(10), ratelimit.WithNamespace("api"))
//	...
//	d, err := limiter.Allow(ctx, "tenant-42")
//	if err == nil && !d.Allowed {
//		// reject, and tell the client to come back after d.RetryAfter
//	}
//
// A denial is a Decision with Allowed false, never an error: an error is the caller's
// mistake (ErrInvalidRule, ErrInvalidN, ErrDuplicateKey, matched with errors.Is) or a
// failure of the store's backend (ErrUnavailable).
//
// Limiters on one store count together when they share an algorithm, a namespace and a
// key. Name the namespace (WithNamespace): by default it is the rule's, and a limiter
// whose rule changes starts every key afresh.
//
// Every algorithm's limiter (AlgorithmLimiter) also decides under a rule chosen per call
// (AllowRule), peeks, refunds and resets a key. AllowAll decides under several limits
// at once, all or none; Wait blocks until a limiter allows; InFlightLimiter bounds the
// requests of a key in progress at once; WithReserves sheds the least important
// requests first under overload (Priority, WithPriority); Middleware limits net/http
// handlers, with the usual headers. fixedwindow.NewQuota counts in calendar days, weeks,
// months or years of a time zone.
//
// # Time
//
// Time has microsecond resolution and comes from the store: a clock.Clock for
// localstore, Redis's own clock for redisstore. A clock that goes back never creates
// allowance, and never locks a key for the length of the step. Behind a key's latest
// instant by less than the key's period (clocks a little apart, a small correction), a
// decision is made as at that latest instant, and its durations count from the caller's
// clock. Behind by more (a clock stepped forward and back, a virtual machine resumed),
// the key's whole state moves back by whole periods to within one period of now, so
// that it decides as it would have at its latest instant less those periods: it waits at
// most a period longer than its rule has it. A calendar quota carries its count into the
// window of now; a lease of an in-flight limit never lasts more than its duration from
// now. Instances whose clocks (redisstore.WithClock) differ by more than a period count
// as a clock stepped back at each alternation, and may admit more than the rule.
//
// # Stores
//
// localstore, redisstore, fallback and hotkey's are this module's stores. The contract
// between limiters, algorithms and stores is internal (internal/core): stores outside
// this module are not supported.
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
	// Allowed says whether the n events were admitted (and counted).
	Allowed bool
	// Limit is the most this key can ever be allowed at once: the bucket's capacity, the
	// queue's size, or the window's limit.
	Limit int64
	// Remaining is how many more events would be allowed right now; never negative.
	Remaining int64
	// RetryAfter, when denied, is the earliest time from now at which the same request
	// could be allowed, rounded up; 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is the time until the key is back to its full allowance; 0 if it is.
	ResetAfter time.Duration
	// Delay, when allowed by a shaping algorithm (leaky bucket), is how long to wait
	// before proceeding so that admitted events leave at an even pace; 0 otherwise.
	Delay time.Duration
}

// Wait is WaitN with n = 1.
func Wait(ctx context.Context, l Limiter, key string) error {
	return WaitN(ctx, l, key, 1)
}

// WaitN blocks until n events for key are allowed and their Delay has passed, or until
// ctx ends. While denied it sleeps for RetryAfter and asks again; when ctx has a deadline
// that comes before the next retry it returns at once with an error that matches
// context.DeadlineExceeded. An error from the limiter is returned as it is. Sleeping uses
// real time (time.NewTimer), whatever clock the limiter's store uses.
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
