package fallback

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// Flush waits until what the store still sends the primary in the background has
// landed, or ctx ends. Call it on shutdown, once the limiters decide no more.
//
// Three things go on after a decision returns. A call of the primary that outlived its
// wait is reconciled with the share's decision. What the shares admitted while the
// primary was slow is charged to it. Refunds of takes the primary counted are given
// back. Without Flush, an instance that exits drops them. The primary then counts what
// a share admitted nowhere, or keeps a take that was given back.
//
// Flush returns ctx's error if it ends first. While the breaker is open on an outage,
// Flush returns at once, with an error wrapping ratelimit.ErrUnavailable, if refunds
// wait for the primary. The store still decides after Flush.
func (s *Store) Flush(ctx context.Context) error {
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		if err := s.calls.wait(ctx); err != nil {
			return fmt.Errorf("fallback: Flush: calls of the primary still going on: %w", err)
		}
		answers := s.answers()
		s.debts.mu.Lock()
		paying, quiet, due := s.debts.paying, s.debts.quiet, s.debts.due(answers)
		refunds := len(s.debts.refunds)
		if !paying && due && s.debts.start() {
			paying, quiet = true, s.debts.quiet
			go s.payBack() // now, not payEvery later
		}
		s.debts.mu.Unlock()
		switch {
		case !answers && refunds > 0:
			return fmt.Errorf("fallback: Flush: %d refunds wait for the primary: %w", refunds, ratelimit.ErrUnavailable)
		case paying:
			select {
			case <-quiet:
			case <-ctx.Done():
				return fmt.Errorf("fallback: Flush: debits and refunds still on their way: %w", ctx.Err())
			}
		case s.calls.idle():
			return nil
		}
		if !paying {
			continue
		}
		// A payment that sent nothing (the primary refused every call before it was sent)
		// leaves its debts owed: try again a moment later, not at once.
		s.debts.mu.Lock()
		again := !s.debts.paying && s.debts.due(s.answers())
		s.debts.mu.Unlock()
		if again {
			retry.Reset(payEvery)
			select {
			case <-retry.C:
			case <-ctx.Done():
				return fmt.Errorf("fallback: Flush: debits and refunds not yet sent: %w", ctx.Err())
			}
		}
	}
}

// calls counts the calls of the primary still going on, answered or not, and lets
// Flush wait for none.
type calls struct {
	mu   sync.Mutex
	n    int
	none chan struct{} // closed while n is 0; nil until the first call
}

func (c *calls) add() {
	c.mu.Lock()
	if c.n == 0 {
		c.none = make(chan struct{})
	}
	c.n++
	c.mu.Unlock()
}

func (c *calls) done() {
	c.mu.Lock()
	c.n--
	if c.n == 0 {
		close(c.none)
	}
	c.mu.Unlock()
}

func (c *calls) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n == 0
}

// wait waits until no call goes on, or ctx ends.
func (c *calls) wait(ctx context.Context) error {
	c.mu.Lock()
	none := c.none
	n := c.n
	c.mu.Unlock()
	if n == 0 {
		return nil
	}
	select {
	case <-none:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
