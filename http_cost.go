package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Cost is what a request costs in a limit's events when the cost is known only once the
// request has been served: the tokens of a language model's completion, the bytes
// streamed, the rows scanned. The request is admitted on its Estimate, and once its
// handler has returned the limit is charged the difference to its Actual cost: a debit
// (AlgorithmLimiter.Debit) when it cost more, which may take the key below zero so that
// its next requests are denied until the debt is repaid, or a refund when it cost less.
//
// A Cost applies to the Middleware's Limiter (Middleware.Cost) or to one of its Policies
// (Policy.Cost), whose limiter must be of an algorithm that takes debts (the token
// bucket, the fixed and sliding windows, the calendar quotas): Wrap panics otherwise.
type Cost struct {
	// Estimate is the events a request is admitted on (its max_tokens, its
	// Content-Length): 1 when nil or below 1. An estimate above what the limit can ever
	// admit at the request's priority is admitted as that much, and the rest is charged
	// after the answer.
	Estimate func(r *http.Request) int64

	// Actual is what the request cost, from the request and its answer (see CostHeader
	// for a cost the upstream reports in a header or trailer). A value below 0 says that
	// the cost is unknown: the estimate stands. Nil charges the bytes of the response's
	// body. It runs on the request's goroutine once the handler has returned (not if it
	// panicked), and the charge is made on a context that outlives the request's, so
	// that a client that left still pays for what it was served.
	Actual func(r *http.Request, a Answer) int64

	// Unit is the quota's unit, which RateLimit-Policy states as its qu parameter (the
	// IETF draft's quota units: "requests", the default, is left out; "content-bytes"
	// for bytes). Any other unit (a model's "tokens") must be a valid header string; the
	// draft lets a service name its own, which clients that do not know it ignore.
	Unit string
}

// Answer is what a handler wrote: its status, the bytes of its body, and its header
// once it returned, with the trailers it set.
type Answer struct {
	Status int
	Bytes  int64
	Header http.Header
}

// CostHeader is a Cost.Actual that reads the cost from the response header or trailer
// name the handler (an upstream behind a reverse proxy) sets: a decimal count. A
// response without it, or with anything else in it, keeps the estimate.
func CostHeader(name string) func(r *http.Request, a Answer) int64 {
	return func(_ *http.Request, a Answer) int64 {
		v := a.Header.Get(name)
		if v == "" {
			v = a.Header.Get(http.TrailerPrefix + name)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return -1
		}
		return n
	}
}

// charge is one limit's charge after a request's answer: the limiter, the key and the
// Spec the request was admitted under, the events it was admitted on, the estimate and
// the Cost.
type charge struct {
	l        *AlgorithmLimiter
	key      string
	spec     *Spec
	cost     *Cost
	admitted int64
	estimate int64
}

// checkCost is why cost cannot be charged to l, or nil.
func checkCost(what string, l Limiter, cost *Cost) error {
	if cost == nil {
		return nil
	}
	b, ok := l.(algorithmBased)
	if !ok || b.base() == nil {
		return fmt.Errorf("ratelimit: %s has a Cost, and %T is not a limiter of an algorithm package", what, l)
	}
	if b.base().alg.Debit == nil {
		return fmt.Errorf("ratelimit: %s has a Cost, and %s takes no debts", what, b.base().alg.Name)
	}
	if _, ok := sfString(cost.Unit); !ok {
		return fmt.Errorf("ratelimit: %s: the Cost's unit %q is not a header string (printable ASCII)", what, cost.Unit)
	}
	return nil
}

// admit is the charge of r on key under l's spec (whose rule's Limit is limit) and cost,
// with the events to admit r on: its estimate, at least 1, at most what the rule ever
// admits at the request's reserve.
func admit(r *http.Request, l *AlgorithmLimiter, key string, spec *Spec, limit int64, cost *Cost) charge {
	est := int64(1)
	if cost.Estimate != nil {
		est = max(1, cost.Estimate(r))
	}
	most := limit - mathx.Keep(limit, spec.Reserve)
	return charge{l: l, key: key, spec: spec, cost: cost, admitted: max(1, min(est, most)), estimate: est}
}

// settle charges the key what the request cost beyond or below what it was admitted on,
// under the rule it was admitted under, once its handler has returned; a failure is
// logged (the key keeps the estimate).
func (c charge) settle(ctx context.Context, o observer, r *http.Request, a Answer) {
	cost := c.estimate
	switch {
	case c.cost.Actual == nil:
		cost = a.Bytes
	default:
		if n := c.cost.Actual(r, a); n >= 0 {
			cost = n
		}
	}
	if cost == c.admitted {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseTimeout)
	defer cancel()
	req := Request{Key: c.key, N: min(cost-c.admitted, mathx.MaxExact), Spec: withOp(c.spec, "debit")}
	if cost < c.admitted { // given back, as a Refund gives, whatever the reserve
		req.N, req.Spec = c.admitted-cost, withOp(c.spec, "refund")
		req.Spec.Reserve = 0
	}
	if _, err := c.l.store.Apply(ctx, req); err != nil {
		o.warn(ctx, "charging a request's cost", c.key, errors.Join(fmt.Errorf("%d events, admitted on %d", cost, c.admitted), err))
	}
}

// answerWriter is a ResponseWriter that keeps what the handler wrote for the charge.
type answerWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *answerWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the writer below (to flush a stream).
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush flushes a stream, for handlers that assert http.Flusher.
func (w *answerWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *answerWriter) answer() Answer {
	status := w.status
	if status == 0 {
		status = http.StatusOK
	}
	return Answer{Status: status, Bytes: w.bytes, Header: w.Header()}
}

// serveCharged serves r and then charges each limit in charges what r cost.
func (m *Middleware) serveCharged(w http.ResponseWriter, r *http.Request, key string, next http.Handler, charges []charge) {
	if len(charges) == 0 {
		m.serveInFlight(w, r, key, next)
		return
	}
	aw := &answerWriter{ResponseWriter: w}
	m.serveInFlight(aw, r, key, next)
	a := aw.answer()
	for _, c := range charges {
		c.settle(r.Context(), m.observer(), r, a)
	}
}
