package ratelimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Cost is what a request costs in a limit's events, when the cost is known only once the
// request has been served. Examples are the tokens of a language model's completion, the
// bytes streamed, or the rows scanned. The request is admitted on its Estimate. Once its
// handler has returned, the limit is charged the difference to its Actual cost. A request
// that cost more is charged the rest as a debit (see AlgorithmLimiter.Debit). The key may
// then go below zero, and its next requests are denied until the debt is repaid. A
// request that cost less gets the difference back.
//
// A Cost applies to the Middleware's Limiter (Middleware.Cost) or to one of its Policies
// (Policy.Cost). That limiter must be of an algorithm that takes debts: the token bucket,
// the fixed and sliding windows, or the calendar quotas. Wrap panics otherwise.
type Cost struct {
	// Estimate is the events a request is admitted on (its max_tokens, its
	// Content-Length). It is 1 when nil or below 1. If the limit can never admit that
	// many at the request's priority, the request is admitted on the most it can. The rest
	// is charged after the answer.
	Estimate func(r *http.Request) int64

	// Actual is what the request cost, from the request and its answer. See CostHeader
	// for a cost the upstream reports in a header or trailer. A value below 0 says that
	// the cost is unknown, and the estimate stands. Nil charges the bytes of the
	// response's body. Actual runs on the request's goroutine once the handler has
	// returned, but not if it panicked. A client that has gone away still pays for what
	// it was served.
	Actual func(r *http.Request, a Answer) int64

	// Unit is the quota's unit. RateLimit-Policy states it as its qu parameter, in the
	// IETF draft's quota units. The default, "requests", is left out. Use
	// "content-bytes" for bytes. Any other unit (a model's "tokens") must be a valid
	// header string, or Wrap panics. The draft lets a service name its own units.
	// Clients that do not know a unit ignore it.
	Unit string

	// Max is the most one request is charged, whatever Actual says. It guards against an
	// upstream that reports a huge cost. A cost above Max is charged as Max, and logged at
	// Warn with the cost reported. 0 means ten times the limit's Limit, or the request's
	// estimate if that is more. That is a debt of ten periods at most: a budget of 1,000
	// tokens a minute charges a request at most 10,000. Wrap panics if Max is below 0.
	Max int64
}

// Answer is what a handler wrote, for Cost.Actual.
type Answer struct {
	// Status is the response's status code: 200 when the handler wrote none.
	Status int
	// Bytes is the length of the response's body, in bytes.
	Bytes int64
	// Header is the response's header once the handler returned, with the trailers it
	// set.
	Header http.Header
}

// CostHeader returns a Cost.Actual that reads the cost from the response header or
// trailer called name. The handler sets it, or an upstream behind a reverse proxy. Its
// value must be one decimal count. Otherwise the estimate stands: when the header is
// missing, given twice, or holds a list, a sign or a space. An answer that says two costs
// says none.
func CostHeader(name string) func(r *http.Request, a Answer) int64 {
	return func(_ *http.Request, a Answer) int64 {
		vs := a.Header.Values(name)
		if len(vs) == 0 {
			vs = a.Header.Values(http.TrailerPrefix + name)
		}
		if len(vs) != 1 {
			return -1
		}
		v := vs[0]
		for i := 0; i < len(v); i++ {
			if v[i] < '0' || v[i] > '9' {
				return -1
			}
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return -1
		}
		return n
	}
}

// charge is one limit's take of a request, with the receipt of it, for what follows the
// answer: the store, the key, the Spec the request was admitted under and its Receipt,
// the events it was admitted on, the estimate, and the Cost to settle (nil: a
// take of one event, given back only if the request is refused after all, for being one
// too many in progress); the zero charge is none.
type charge struct {
	store    Store
	key      string
	spec     *core.Spec
	receipt  *core.Receipt
	cost     *Cost
	admitted int64
	estimate int64
	limit    int64 // the rule's Limit, Cost.Max's default
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
	return checkCostFields(what, cost)
}

// checkCostFields is why cost's own fields are invalid, or nil.
func checkCostFields(what string, cost *Cost) error {
	if _, ok := sfString(cost.Unit); !ok {
		return fmt.Errorf("ratelimit: %s: the Cost's unit %q is not a header string (printable ASCII)", what, cost.Unit)
	}
	if cost.Max < 0 {
		return fmt.Errorf("ratelimit: %s: the Cost's Max is %d; want 0 (the limit's Limit) or more", what, cost.Max)
	}
	return nil
}

// admit is the charge of r on key under l's spec (whose rule's Limit is limit) and cost
// (nil: one event), with the events to admit r on: its estimate, at least 1, at most what
// the rule ever admits at the request's reserve. Its take writes a receipt.
func admit(r *http.Request, l *AlgorithmLimiter, key string, spec *core.Spec, limit int64, cost *Cost) charge {
	est := int64(1)
	if cost != nil && cost.Estimate != nil {
		est = max(1, cost.Estimate(r))
	}
	most := limit - mathx.Keep(limit, spec.Reserve)
	return charge{store: l.store, key: key, spec: spec, receipt: &core.Receipt{}, cost: cost, admitted: max(1, min(est, most)),
		estimate: est, limit: limit}
}

// request is the charge's take.
func (c charge) request() core.Request {
	return core.Request{Key: c.key, N: c.admitted, Spec: c.spec, Receipt: c.receipt}
}

// settle charges the key what the request cost beyond or below what it was admitted on,
// under the rule it was admitted under, once its handler has returned: at most Cost.Max
// (logged past it); a failure is logged (the key keeps the estimate).
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
	if most := cmp.Or(c.cost.Max, max(min(10*c.limit, mathx.MaxExact), c.estimate)); cost > most {
		o.warn(ctx, "a request's cost above its bound (Cost.Max) is charged the bound", c.key,
			fmt.Errorf("a cost of %d, charged %d", cost, most))
		cost = most
	}
	c.charge(ctx, o, cost)
}

// giveBack gives back everything the charge took: its request was refused after all.
func (c charge) giveBack(ctx context.Context, o observer) { c.charge(ctx, o, 0) }

// charge charges the key cost events in all, of the admitted: the rest as a debit, or
// the difference back (whatever the reserve, as far as the key would still hold it: see
// core.Receipt).
func (c charge) charge(ctx context.Context, o observer, cost int64) {
	if cost == c.admitted {
		return
	}
	// The charge outlives the request's context: a client that left still pays for what
	// it was served.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseTimeout)
	defer cancel()
	req := core.Request{Key: c.key, N: min(cost-c.admitted, mathx.MaxExact), Spec: core.WithOp(c.spec, core.OpDebit)}
	if cost < c.admitted {
		req.N, req.Spec, req.Receipt = c.admitted-cost, core.WithOp(c.spec, core.OpRefund), c.receipt
		req.Spec.Reserve = 0
	}
	if _, err := c.store.Apply(ctx, req); err != nil {
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
