package fallback_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// primary is a stand-in primary store: it answers from a localstore, fails with err, or
// hangs until released, ignoring its context (as a client without context deadlines).
type primary struct {
	local ratelimit.Store
	slow  atomic.Int64 // time.Duration each answer takes, on the test's clock
	err   atomic.Pointer[error]
	once  atomic.Pointer[error] // the error of the next call alone
	hang  atomic.Pointer[chan struct{}]
	calls atomic.Int64
}

func newPrimary() *primary { return &primary{local: localstore.New()} }

func (p *primary) fail(err error) { p.err.Store(&err) }
func (p *primary) heal()          { p.err.Store(nil); p.hang.Store(nil) }
func (p *primary) hangUntil(release chan struct{}) {
	p.hang.Store(&release)
}

func (p *primary) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	p.calls.Add(1)
	if d := p.slow.Load(); d > 0 {
		time.Sleep(time.Duration(d)) // the primary's time to answer, in a synctest bubble
	}
	if h := p.hang.Load(); h != nil {
		<-*h
	}
	if err := p.err.Load(); err != nil {
		return core.Outcome{}, *err
	}
	if err := p.once.Swap(nil); err != nil {
		return core.Outcome{}, *err
	}
	return p.local.Apply(ctx, req)
}

var errDown = fmt.Errorf("connection refused: %w", ratelimit.ErrUnavailable)

func req(key string, rule ratelimit.Rule) core.Request {
	return core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule)}}
}

// A healthy primary decides everything, exactly. (Given a timeout it never reaches: a
// decision the primary is too slow for is decided again locally, and may count twice.)
func TestConformanceHealthyPrimary(t *testing.T) {
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return fallback.New(localstore.New(localstore.WithClock(clk)), localstore.New(localstore.WithClock(clk)),
			fallback.WithTimeout(time.Minute))
	})
}

// With the primary down, the secondary decides the whole rule (one instance). It lends
// nothing then (TestLend): the suite sees it as the BatchStore it is.
func TestConformancePrimaryDown(t *testing.T) {
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		p := newPrimary()
		p.fail(errDown)
		return struct{ core.BatchStore }{fallback.New(batchPrimary{p}, localstore.New(localstore.WithClock(clk)))}
	})
}

// batchPrimary is a primary that batches, and fails its batches as its Apply does. With
// a primary that does not batch, ApplyAll leaves the parts to AllowAll one by one while
// the breaker is closed: a refund of a denied request's takes may give back less (a
// bucket's record of deficits keeps eight entries), which the suite counts as lost.
type batchPrimary struct{ *primary }

func (b batchPrimary) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	b.calls.Add(1)
	if err := b.err.Load(); err != nil {
		return nil, *err
	}
	return b.local.(core.BatchStore).ApplyAll(ctx, reqs)
}

// TestLend: the store lends the primary's events while the breaker is closed, and none
// while it is open, or when the primary does not lend: never the secondary's.
func TestLend(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	loan := []core.Loan{{Key: "k", Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(10))},
		Holder: 1, Want: 4, Share: 1, TTL: time.Second}}
	primary := localstore.New(localstore.WithClock(clk))
	s := fallback.New(primary, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk))
	got, err := s.Lend(context.Background(), loan)
	if err != nil || got[0].N != 4 {
		t.Fatalf("Lend on a healthy primary: %+v, %v; want 4 lent", got, err)
	}
	if d, _ := primary.Apply(context.Background(), req("k", ratelimit.PerSecond(10))); d.Remaining != 5 {
		t.Errorf("the primary after the loan and a take: %+v; want 5 left", d)
	}
	p := newPrimary()
	s = fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk))
	if _, err := s.Lend(context.Background(), loan); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("Lend on a primary that does not lend: %v; want ErrUnavailable", err)
	}
	lp := &lending{primary: newPrimary()}
	s = fallback.New(lp, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk),
		fallback.WithBreaker(fallback.Breaker{MinCalls: 1, OpenFor: time.Hour}))
	lp.fail(errDown)
	for i := 0; i < 100 && s.BreakerState() == fallback.Closed; i++ {
		s.Apply(context.Background(), req("other", ratelimit.PerSecond(10)))
	}
	if s.BreakerState() != fallback.Open {
		t.Fatalf("breaker %v; want open", s.BreakerState())
	}
	if _, err := s.Lend(context.Background(), loan); !errors.Is(err, ratelimit.ErrUnavailable) || lp.lends.Load() != 0 {
		t.Errorf("Lend with the breaker open: %v after %d loans asked of the primary; want ErrUnavailable, none", err, lp.lends.Load())
	}
}

// TestPartialTakeFallsBack: AllowAtMost is a decision, as a take is: a primary that fails
// while the breaker is still closed (Redis just killed) sends it to the share, never its
// error; a healthy one decides it, mirrored on the share. (The timeout is a minute: under
// -race beside another run, the default 5ms sent the healthy primary's call to the share.)
func TestPartialTakeFallsBack(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	lp := &lending{primary: newPrimary()}
	s := fallback.New(lp, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk), fallback.WithInstances(2),
		fallback.WithTimeout(time.Minute), fallback.WithMaxTimeout(time.Minute))
	l, err := tokenbucket.New(s, ratelimit.PerSecond(10), ratelimit.WithNamespace("atmost"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, d, err := l.AllowAtMost(ctx, "k", 3)
	if err != nil || got != 3 || d.Remaining != 7 {
		t.Fatalf("on a healthy primary: %d granted, %+v, %v; want 3 of 10", got, d, err)
	}
	lp.fail(errDown)
	got, d, err = l.AllowAtMost(ctx, "k", 9)
	if err != nil || s.BreakerState() != fallback.Closed {
		t.Fatalf("the primary failing, the breaker %v: %v; want the share's answer, no error", s.BreakerState(), err)
	}
	if got != 2 || d.Limit != 10 || d.Remaining != 0 { // the share holds 5, of which the mirror took 3; the client reads the rule's limit
		t.Errorf("on the share: %d granted, %+v; want 2 of a share of 5, under the rule's Limit of 10", got, d)
	}
}

// lending is a primary that lends (from its store in memory), and counts its loans.
type lending struct {
	*primary
	lends atomic.Int64
}

func (l *lending) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	l.lends.Add(1)
	if err := l.err.Load(); err != nil {
		return nil, *err
	}
	return l.local.(core.Lender).Lend(ctx, loans)
}

func TestBreaker(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	p := newPrimary()
	var changes []string
	s := fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk), fallback.WithTimeout(time.Minute),
		fallback.WithBreaker(fallback.Breaker{MinCalls: 3, OpenFor: time.Second}),
		fallback.WithHooks(fallback.Hooks{OnStateChange: func(from, to fallback.BreakerState) {
			changes = append(changes, from.String()+">"+to.String())
		}}))
	ctx := context.Background()
	rule := ratelimit.PerHour(1000)
	decide := func() {
		t.Helper()
		if d, err := s.Apply(ctx, req("k", rule)); err != nil || !d.Allowed() {
			t.Fatalf("Apply = %+v, %v", d, err)
		}
	}
	p.fail(errDown)
	for i := range 3 {
		if s.BreakerState() != fallback.Closed {
			t.Fatalf("open after %d failures", i)
		}
		decide()
	}
	if s.BreakerState() != fallback.Open || p.calls.Load() != 3 {
		t.Fatalf("after 3 failures: %v, %d calls; want open, 3 calls", s.BreakerState(), p.calls.Load())
	}
	for range 10 {
		decide()
	}
	if p.calls.Load() != 3 {
		t.Errorf("the primary was called %d times while open; want none", p.calls.Load()-3)
	}
	clk.Advance(time.Second)
	decide() // the probe fails: open again
	if s.BreakerState() != fallback.Open || p.calls.Load() != 4 {
		t.Fatalf("after a failed probe: %v, %d calls", s.BreakerState(), p.calls.Load())
	}
	clk.Advance(999 * time.Millisecond)
	decide()
	if p.calls.Load() != 4 {
		t.Errorf("probed again before OpenFor")
	}
	p.heal()
	clk.Advance(time.Millisecond)
	decide() // the probe succeeds: closed
	if s.BreakerState() != fallback.Closed || p.calls.Load() != 5 {
		t.Fatalf("after a good probe: %v, %d calls", s.BreakerState(), p.calls.Load())
	}
	want := "closed>open open>half-open half-open>open open>half-open half-open>closed"
	if got := fmt.Sprint(changes); got != "["+want+"]" {
		t.Errorf("state changes %v; want [%s]", got, want)
	}
}

// TestOneProbe: while the probe is out, every other call decides locally at once.
func TestOneProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		s := fallback.New(p, localstore.New(), fallback.WithBreaker(fallback.Breaker{MinCalls: 1}),
			fallback.WithTimeout(time.Second))
		rule := ratelimit.PerHour(1000)
		p.fail(errDown)
		s.Apply(t.Context(), req("k", rule)) // opens the breaker
		time.Sleep(fallback.DefaultOpenFor)
		release := make(chan struct{})
		p.heal()
		p.hangUntil(release)
		go s.Apply(t.Context(), req("k", rule)) // the probe, hanging
		synctest.Wait()
		start := time.Now()
		for range 20 {
			if d, err := s.Apply(t.Context(), req("k", rule)); err != nil || !d.Allowed() {
				t.Fatal(d, err)
			}
		}
		if waited := time.Since(start); waited != 0 || p.calls.Load() != 2 {
			t.Errorf("during the probe: waited %v, %d primary calls; want no wait, the probe alone", waited, p.calls.Load()-1)
		}
		close(release)
		synctest.Wait()
		if s.BreakerState() != fallback.Closed {
			t.Errorf("after a good probe: %v", s.BreakerState())
		}
	})
}

// TestTimeoutBoundsTheWait: a primary that ignores its context holds no decision longer
// than the timeout; its calls count as failures once they have gone unanswered for the
// breaker's Unanswered (100ms), and they open the breaker once those failures have gone
// on into a second tenth of its window. No decision waits after that.
func TestTimeoutBoundsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		release := make(chan struct{})
		defer close(release)
		p.hangUntil(release)
		s := fallback.New(p, localstore.New(), fallback.WithTimeout(3*time.Millisecond))
		// decision i waits from 3i to 3i+3ms and fails unanswered at 3i+103ms: the first
		// failure in the window's third tenth, from 200ms, is decision 33's, at 202ms, while
		// decision 67 waits; decision 68 is the first not to
		const tripping = 68
		for i := range tripping + 3 {
			start := time.Now()
			d, err := s.Apply(t.Context(), req("k", ratelimit.PerHour(100)))
			waited := time.Since(start)
			if err != nil || !d.Allowed() {
				t.Fatalf("decision %d: %+v, %v", i, d, err)
			}
			want := 3 * time.Millisecond
			if i >= tripping {
				want = 0 // the breaker is open: no wait at all
			}
			if waited != want {
				t.Errorf("decision %d waited %v; want %v (breaker %v)", i, waited, want, s.BreakerState())
			}
		}
	})
}

// TestLateAnswersKeepBreakerClosed: a primary that answers every call, but each after
// the timeout, is a slow primary, not a failed one: the breaker stays closed, and the
// timeout follows the round trip its answers measure, so that the primary decides again.
func TestLateAnswersKeepBreakerClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		p.slow.Store(int64(8 * time.Millisecond))
		s := fallback.New(p, localstore.New(), fallback.WithTimeout(5*time.Millisecond))
		var primary int // of the last 50 decisions
		for i := range 100 {
			start := time.Now()
			d, err := s.Apply(t.Context(), req("k", ratelimit.PerHour(1000)))
			if err != nil || !d.Allowed() {
				t.Fatalf("%+v, %v", d, err)
			}
			if i >= 50 && time.Since(start) == 8*time.Millisecond {
				primary++ // decided by the primary, which took 8ms
			}
			synctest.Wait() // the late answer of a decision made on the secondary is in
		}
		if s.BreakerState() != fallback.Closed {
			t.Errorf("the breaker is %v on a primary that answers every call in 8ms", s.BreakerState())
		}
		if primary != 50 { // the first 20 answers, all late, measure the round trip
			t.Errorf("the primary decided %d of the last 50; want all, the timeout following its 8ms", primary)
		}
		if got := s.Timeout(); got < 8*time.Millisecond || got > fallback.DefaultMaxTimeout {
			t.Errorf("Timeout() = %v; want the 8ms round trip and room, below the maximum", got)
		}
	})
}

// TestTimeoutBurstKeepsBreakerClosed: a burst of calls gone unanswered within a tenth of
// the window, as when the process is starved of CPU as a load starts, does not open the
// breaker, even with no answer beside them; an error wrapping ErrUnavailable among them
// does.
func TestTimeoutBurstKeepsBreakerClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		release := make(chan struct{})
		p.hangUntil(release)
		s := fallback.New(p, localstore.New(), fallback.WithTimeout(time.Millisecond))
		var wg sync.WaitGroup
		for range 50 { // 50 callers at once, each timing out after 1ms
			wg.Go(func() { s.Apply(t.Context(), req("k", ratelimit.PerHour(100))) })
		}
		wg.Wait()
		time.Sleep(fallback.DefaultUnanswered) // all 50 now count as unanswered, at 101ms
		synctest.Wait()
		if s.BreakerState() != fallback.Closed {
			t.Fatalf("a burst of 50 unanswered calls within 1ms opened the breaker")
		}
		p.heal() // no more hanging
		close(release)
		p.fail(errDown)
		s.Apply(t.Context(), req("k", ratelimit.PerHour(100)))
		if s.BreakerState() != fallback.Open {
			t.Fatalf("an error after 50 unanswered calls left the breaker %v", s.BreakerState())
		}
	})
}

// TestCallerGivesUp: a caller's cancelled or expired context is its answer, and never
// counts against the primary.
func TestCallerGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		release := make(chan struct{})
		defer close(release)
		p.hangUntil(release)
		s := fallback.New(p, localstore.New(), fallback.WithTimeout(time.Second))
		for range 20 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
			_, err := s.Apply(ctx, req("k", ratelimit.PerHour(10)))
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a caller whose deadline passed: %v", err)
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := s.Apply(ctx, req("k", ratelimit.PerHour(10))); !errors.Is(err, context.Canceled) {
			t.Errorf("a cancelled caller: %v", err)
		}
		if s.BreakerState() != fallback.Closed {
			t.Errorf("callers giving up moved the breaker to %v", s.BreakerState())
		}
	})
}

// TestOtherErrors: an error that is not about availability is answered locally but does
// not count against the primary; an invalid request reaches neither store.
func TestOtherErrors(t *testing.T) {
	p := newPrimary()
	p.fail(errors.New("ERR Error running script: a bug"))
	var failures []bool
	s := fallback.New(p, localstore.New(), fallback.WithTimeout(time.Minute), fallback.WithHooks(fallback.Hooks{
		OnPrimaryError: func(_ error, failure bool) { failures = append(failures, failure) },
	}))
	for range 10 {
		if d, err := s.Apply(context.Background(), req("k", ratelimit.PerHour(10))); err != nil || !d.Allowed() {
			t.Fatal(d, err)
		}
	}
	if s.BreakerState() != fallback.Closed || len(failures) != 10 || failures[0] {
		t.Errorf("state %v, failures %v; want closed, 10 errors, none a failure", s.BreakerState(), failures)
	}
	bad := req("k", ratelimit.PerHour(10))
	bad.N = 11
	calls := p.calls.Load()
	if _, err := s.Apply(context.Background(), bad); !errors.Is(err, ratelimit.ErrInvalidN) || p.calls.Load() != calls {
		t.Errorf("an invalid request: %v, primary called %d times", err, p.calls.Load()-calls)
	}
}

// TestShare: while the primary is down, each of 4 instances admits a quarter of the rule.
func TestShare(t *testing.T) {
	p := newPrimary()
	p.fail(errDown)
	rule := ratelimit.PerHour(100)
	total := 0
	for range 4 {
		s := fallback.New(p, localstore.New(), fallback.WithInstances(4))
		for range 50 {
			if d, err := s.Apply(context.Background(), req("k", rule)); err != nil {
				t.Fatal(err)
			} else if d.Allowed() {
				total++
			}
		}
	}
	if total != 100 {
		t.Errorf("4 instances admitted %d; want 4 x 25 = 100", total)
	}
	// a request for more than the share can allow is denied, not an error
	s := fallback.New(p, localstore.New(), fallback.WithInstances(20))
	big := req("big", rule)
	big.N = 10
	if d, err := s.Apply(context.Background(), big); err != nil || d.Allowed() || d.Limit() != 100 || d.Wait <= 0 {
		t.Errorf("10 of a share of 5: %+v, %v; want denied with a retry, under the rule's Limit", d, err)
	}
}

func TestPolicies(t *testing.T) {
	p := newPrimary()
	p.fail(errDown)
	rule := ratelimit.PerHour(3)
	allow := fallback.New(p, localstore.New(), fallback.WithPolicy(fallback.FailOpen))
	deny := fallback.New(p, localstore.New(), fallback.WithPolicy(fallback.FailClosed))
	for range 10 {
		if d, err := allow.Apply(context.Background(), req("k", rule)); err != nil || !d.Allowed() {
			t.Fatalf("FailOpen: %+v, %v", d, err)
		}
		if d, err := deny.Apply(context.Background(), req("k", rule)); err != nil || d.Allowed() || d.Wait <= 0 {
			t.Fatalf("FailClosed: %+v, %v", d, err)
		}
	}
}

func TestHooks(t *testing.T) {
	p := newPrimary()
	var mu sync.Mutex
	sources := map[fallback.Source]int{}
	s := fallback.New(p, localstore.New(), fallback.WithTimeout(time.Minute), fallback.WithHooks(fallback.Hooks{
		OnDecision: func(src fallback.Source, latency time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			sources[src]++
			if latency < 0 || (src == fallback.Secondary && latency != 0) {
				t.Errorf("latency %v from %v", latency, src)
			}
		},
	}))
	ctx := context.Background()
	inflight, err := ratelimit.NewInFlight(s, 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// a decision each: three takes, an in-flight acquire (its release and extension
	// decide nothing, nor does a peek), and ApplyAll's two requests
	for range 3 {
		s.Apply(ctx, req("k", ratelimit.PerHour(10)))
	}
	peek := req("k", ratelimit.PerHour(10))
	peek.Spec.Op = core.OpPeek
	s.Apply(ctx, peek)
	lease, _, err := inflight.Acquire(ctx, "k")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v, %v", lease, err)
	}
	lease.Extend(ctx)
	lease.Release(ctx)
	core.ApplyAll(ctx, s, []core.Request{req("a", ratelimit.PerHour(10)), req("b", ratelimit.PerHour(10))})
	p.fail(errDown)
	for range 2 {
		s.Apply(ctx, req("k", ratelimit.PerHour(10)))
	}
	s.Apply(ctx, peek)
	core.ApplyAll(ctx, s, []core.Request{req("a", ratelimit.PerHour(10)), req("b", ratelimit.PerHour(10))})
	mu.Lock()
	defer mu.Unlock()
	if sources[fallback.Primary] != 6 || sources[fallback.Secondary] != 4 {
		t.Errorf("decisions by source: %v; want 6 primary (3 takes, 1 acquire, 2 of a batch), 4 secondary", sources)
	}
	batched := 0 // a primary that decides a batch at once: a decision per request still
	b := fallback.New(localstore.New(), localstore.New(), fallback.WithTimeout(time.Minute), fallback.WithHooks(fallback.Hooks{
		OnDecision: func(fallback.Source, time.Duration) { batched++ },
	}))
	if _, err := b.ApplyAll(ctx, []core.Request{req("a", ratelimit.PerHour(10)), req("b", ratelimit.PerHour(10)),
		req("c", ratelimit.PerHour(10))}); err != nil || batched != 3 {
		t.Errorf("a batch of 3: %v, %d decisions reported", err, batched)
	}
}

// TestNewRejectsNil: a missing store panics at New with a message, not at the first
// decision that falls back (which, in production, comes only during an outage).
func TestNewRejectsNil(t *testing.T) {
	local := localstore.New()
	for name, f := range map[string]func(){
		"nil primary":           func() { fallback.New(nil, local) },
		"nil secondary":         func() { fallback.New(local, nil) },
		"nil *localstore.Store": func() { fallback.New(local, (*localstore.Store)(nil)) },
		"nil option":            func() { fallback.New(local, local, nil) },
	} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "fallback: New") {
					t.Errorf("%s: recovered %q; want a panic that says what is wrong", name, msg)
				}
			}()
			f()
		}()
	}
}

// panicking is a primary store that panics, as a store built on a nil client would.
type panicking struct{}

func (panicking) Apply(context.Context, core.Request) (core.Outcome, error) {
	var m map[string]int
	m["x"]++ // a nil map: panics
	return core.Outcome{}, nil
}

// TestPrimaryPanics: a panic in the primary, which runs on the fallback's own goroutine
// where no caller could recover it, is a failure of the primary: the decision comes
// from the secondary and the process lives.
func TestPrimaryPanics(t *testing.T) {
	var errs []error
	s := fallback.New(panicking{}, localstore.New(), fallback.WithTimeout(time.Minute), fallback.WithHooks(fallback.Hooks{
		OnPrimaryError: func(err error, failure bool) { errs = append(errs, err) },
	}))
	l, err := tokenbucket.New(s, ratelimit.PerSecond(1))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(context.Background(), "k"); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v; want allowed by the secondary", d, err)
	}
	if len(errs) != 1 || !errors.Is(errs[0], ratelimit.ErrUnavailable) || !strings.Contains(errs[0].Error(), "panicked") {
		t.Errorf("the primary's errors: %v; want one that says it panicked", errs)
	}
}

// TestBreakerRate: the breaker opens on the failure rate of the window, with its minimum
// of calls: a burst of failures among many successes leaves it closed; the same failures
// once the successes have aged out of the window open it.
func TestBreakerRate(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	p := newPrimary()
	s := fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk), fallback.WithTimeout(time.Minute),
		fallback.WithBreaker(fallback.Breaker{FailureRate: 0.5, MinCalls: 20, Window: time.Second}))
	ctx := context.Background()
	rule := ratelimit.PerHour(1_000_000)
	for range 100 {
		s.Apply(ctx, req("k", rule))
		clk.Advance(5 * time.Millisecond)
	}
	p.fail(errDown)
	for range 99 { // 99 at once, beside the 100 successes of the last half second
		s.Apply(ctx, req("k", rule))
	}
	if s.BreakerState() != fallback.Closed {
		t.Fatalf("99 failures beside 100 successes opened the breaker")
	}
	s.Apply(ctx, req("k", rule)) // the 100th: half of the window
	if s.BreakerState() != fallback.Open {
		t.Fatalf("100 failures beside 100 successes left the breaker %v", s.BreakerState())
	}

	p.heal()
	clk.Advance(time.Second)
	s.Apply(ctx, req("k", rule)) // the probe closes it and forgets the window
	if s.BreakerState() != fallback.Closed {
		t.Fatalf("after a good probe: %v", s.BreakerState())
	}
	p.fail(errDown)
	for i := range 19 { // fewer calls than the minimum: closed, whatever the rate
		s.Apply(ctx, req("k", rule))
		if s.BreakerState() != fallback.Closed {
			t.Fatalf("opened after %d calls, under the minimum of 20", i+1)
		}
	}
	clk.Advance(time.Second) // the 19 failures age out
	for range 19 {
		s.Apply(ctx, req("k", rule))
	}
	if s.BreakerState() != fallback.Closed {
		t.Fatalf("opened on failures that had left the window")
	}
	s.Apply(ctx, req("k", rule))
	if s.BreakerState() != fallback.Open {
		t.Fatalf("20 failures of 20 calls in the window left the breaker %v", s.BreakerState())
	}
}

// TestBreakerFlaps: with the primary failing and healing every half second, n instances
// hammering one small key (2 at once, 1 per second) admit no more than the rule allows,
// whichever store decides: the shares are rounded down, and each share has spent what the
// primary admitted (or denied) for its instance. (Without that: 62 for one instance, 121
// for three, against 32 allowed.)
func TestBreakerFlaps(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		clk := clock.NewFake(limitertest.Start)
		p := &primary{local: localstore.New(localstore.WithClock(clk))}
		var instances []*fallback.Store
		for range n {
			instances = append(instances, fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk),
				fallback.WithTimeout(time.Minute), fallback.WithInstances(n), fallback.WithBreaker(fallback.Breaker{OpenFor: 100 * time.Millisecond})))
		}
		rule := ratelimit.Rule{Limit: 1, Period: time.Second, Burst: 2}
		admitted := 0
		for step := range 600 { // 30s in steps of 50ms
			if (step/10)%2 == 1 {
				p.fail(errDown)
			} else {
				p.heal()
			}
			for _, s := range instances {
				d, err := s.Apply(context.Background(), req("shop-a", rule))
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed() {
					admitted++
				}
			}
			clk.Advance(50 * time.Millisecond)
		}
		if allowed := 2 + 30; admitted > allowed || admitted < allowed/2 {
			t.Errorf("%d instances admitted %d in 30s of flapping; the rule allows %d", n, admitted, allowed)
		}
	}
}

// TestLearnedCount: with a learned instance count of 3, each instance admits a third of
// the rule while the primary is down; the count is read at each decision.
func TestLearnedCount(t *testing.T) {
	p := newPrimary()
	p.fail(errDown)
	var count atomic.Int64
	count.Store(3)
	s := fallback.New(p, localstore.New(), fallback.WithInstanceCount(func() int { return int(count.Load()) }))
	admitted := func(key string) int {
		n := 0
		for range 100 {
			if d, err := s.Apply(context.Background(), req(key, ratelimit.PerHour(90))); err != nil {
				t.Fatal(err)
			} else if d.Allowed() {
				n++
			}
		}
		return n
	}
	if n := admitted("a"); n != 30 {
		t.Errorf("a learned count of 3: admitted %d of a rule of 90; want 30", n)
	}
	count.Store(0) // never divides by 0: 1
	if n := admitted("b"); n != 90 {
		t.Errorf("a learned count of 0: admitted %d; want the whole rule, 90", n)
	}
}

// An in-flight limit while the primary is down: each of n instances holds limit/n leases,
// at least one; the leases taken while the primary was up are mirrored onto the share
// with their ids, so that their releases and extensions find them there.
func TestInFlightShare(t *testing.T) {
	ctx := context.Background()
	p := newPrimary()
	p.fail(errDown)
	holds := func(s ratelimit.Store, limit int64) int {
		l, err := ratelimit.NewInFlight(s, limit, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range 20 {
			if lease, _, err := l.Acquire(ctx, "k"); err != nil {
				t.Fatal(err)
			} else if lease != nil {
				n++
			}
		}
		return n
	}
	if n := holds(fallback.New(p, localstore.New(), fallback.WithInstances(3)), 10); n != 3 {
		t.Errorf("a limit of 10 over 3 instances: one held %d leases; want 3", n)
	}
	if n := holds(fallback.New(p, localstore.New(), fallback.WithInstances(20)), 10); n != 1 {
		t.Errorf("a limit of 10 over 20 instances: one held %d leases; want 1", n)
	}

	clk := clock.NewFake(limitertest.Start)
	p = newPrimary()
	s := fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithInstances(2), fallback.WithTimeout(time.Minute),
		fallback.WithBreaker(fallback.Breaker{MinCalls: 1000})) // closed: every call asks the primary
	l, err := ratelimit.NewInFlight(s, 4, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var leases []*ratelimit.Lease
	for range 3 { // on the primary; the share (2) mirrors the first two
		lease, _, err := l.Acquire(ctx, "k")
		if err != nil || lease == nil {
			t.Fatalf("Acquire on the primary = %v, %v", lease, err)
		}
		leases = append(leases, lease)
	}
	p.fail(errDown)
	if lease, d, err := l.Acquire(ctx, "k"); err != nil || lease != nil {
		t.Fatalf("with the share full of mirrored leases, Acquire = %v, %+v, %v; want denied", lease, d, err)
	}
	clk.Advance(30 * time.Second)
	if held, err := leases[0].Extend(ctx); err != nil || !held {
		t.Errorf("extending a mirrored lease on the share = %v, %v; want held", held, err)
	}
	if held, err := leases[2].Extend(ctx); err != nil || held {
		t.Errorf("extending a lease the share never held = %v, %v; want not held", held, err)
	}
	if err := leases[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if lease, _, err := l.Acquire(ctx, "k"); err != nil || lease == nil {
		t.Errorf("after a release on the share, Acquire = %v, %v; want a lease", lease, err)
	}
	clk.Advance(45 * time.Second) // leases[1]'s place was retaken at 30s; leases[0] extended to 90s
	if lease, _, err := l.Acquire(ctx, "k"); err != nil || lease != nil {
		t.Errorf("at 75s, with an extended lease and one of 30s held, Acquire = %v, %v; want denied", lease, err)
	}
}

// The log says when the breaker opens, with the error that opened it, and when the primary
// decides again; an error that opens nothing is logged at most once a second.
func TestLogger(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	p := newPrimary()
	var buf bytes.Buffer
	s := fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk), fallback.WithTimeout(time.Minute),
		fallback.WithBreaker(fallback.Breaker{MinCalls: 3, OpenFor: time.Second}),
		fallback.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	ctx := context.Background()
	decide := func() {
		t.Helper()
		if _, err := s.Apply(ctx, req("k", ratelimit.PerHour(1000))); err != nil {
			t.Fatal(err)
		}
	}
	p.fail(errDown)
	for range 5 {
		decide()
	}
	clk.Advance(time.Second)
	p.heal()
	decide() // the probe: closed again
	p.fail(errors.New("ERR Error running script: a bug"))
	for range 5 {
		decide() // one line for the five
	}
	clk.Advance(time.Second)
	decide() // and one more a second later
	log := buf.String()
	for _, want := range []string{
		`level=WARN msg="fallback: the breaker opened; deciding on the secondary" from=closed err="` + errDown.Error(),
		`level=INFO msg="fallback: the breaker closed; the primary decides again" from=half-open`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s:\n%s", want, log)
		}
	}
	if n := strings.Count(log, "a bug"); n != 2 {
		t.Errorf("%d lines of an error that opens nothing; want 2 (one a second):\n%s", n, log)
	}

	// Redis back with a password: every probe fails with WRONGPASS, which the log says
	// at once and then every 30s, with the probes failed since; a probe's error, of
	// whatever kind, opens the breaker again for OpenFor
	buf.Reset()
	p.fail(errDown)
	for range 3 {
		decide() // opens
	}
	wrongPass := fmt.Errorf("WRONGPASS invalid username-password pair: %w", ratelimit.ErrUnavailable)
	p.fail(wrongPass)
	before := p.calls.Load()
	for range 61 { // a probe a second for a minute
		clk.Advance(time.Second)
		decide()
		decide() // while open: the secondary, no call
	}
	if calls := p.calls.Load() - before; calls != 61 {
		t.Errorf("%d calls of the primary in 61s of failed probes; want 61, one a second", calls)
	}
	log = buf.String()
	if n := strings.Count(log, `msg="fallback: the primary still fails; deciding on the secondary" err="WRONGPASS`); n != 3 {
		t.Errorf("%d lines of failed probes over 61s; want 3 (at once, at 30s, at 60s):\n%s", n, log)
	}
	if !strings.Contains(log, "failed_probes=30") {
		t.Errorf("the log does not count the probes failed between its lines:\n%s", log)
	}
}

// Priorities under the shares: with the primary down, one of 20 instances decides a
// token bucket of 100 at once as its share, 5, and reserves 20% and 50% of that: 1 and 2
// tokens. Ten requests of each priority, least important first, admit 3 sheddable, 1
// normal and 1 critical; the same limiter with a healthy primary admits 50, 30 and 20.
func TestPrioritiesUnderShares(t *testing.T) {
	for _, c := range []struct {
		name string
		down bool
		each int
		want [3]int
	}{{"primary down, a share of 1/20", true, 10, [3]int{3, 1, 1}}, {"primary up", false, 100, [3]int{50, 30, 20}}} {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewFake(limitertest.Start)
			p := newPrimary()
			if c.down {
				p.fail(errDown)
			} else {
				p.local = localstore.New(localstore.WithClock(clk))
			}
			s := fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithInstances(20),
				fallback.WithClock(clk), fallback.WithTimeout(time.Minute))
			l, err := tokenbucket.New(s, limitertest.PriorityRule, ratelimit.WithReserves(limitertest.Reserves...))
			if err != nil {
				t.Fatal(err)
			}
			for i, pr := range []ratelimit.Priority{ratelimit.Sheddable, ratelimit.Normal, ratelimit.Critical} {
				admitted := 0
				for range c.each {
					d, err := l.Allow(ratelimit.WithPriority(context.Background(), pr), "k")
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admitted++
					}
				}
				if admitted != c.want[i] {
					t.Errorf("%d %v requests admitted %d; want %d", c.each, pr, admitted, c.want[i])
				}
			}
		})
	}
}

// TestLateLeaseReleased: an in-flight acquire the primary grants after the timeout, when
// the decision was made on the secondary, is released on the primary at once: nobody
// holds that lease.
func TestLateLeaseReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		p.slow.Store(int64(8 * time.Millisecond))
		s := fallback.New(p, localstore.New(), fallback.WithTimeout(5*time.Millisecond), fallback.WithMaxTimeout(5*time.Millisecond))
		in, err := ratelimit.NewInFlight(s, 2, time.Minute, ratelimit.WithNamespace("late"))
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, d, err := in.Acquire(t.Context(), "k"); err != nil || !d.Allowed {
				t.Fatalf("an acquire: %+v, %v", d, err)
			}
		}
		time.Sleep(20 * time.Millisecond) // the primary's late answers, and the releases
		synctest.Wait()
		p.slow.Store(0)
		d, err := p.local.Apply(t.Context(), core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: concurrency.Algorithm(), Namespace: "late", Rule: core.Rule(in.Rule()), Op: core.OpPeek}})
		if err != nil || d.Remaining != 1 { // a peek of one more: 1 left after it, none held
			t.Errorf("the primary after two late grants: %+v, %v; want both leases released", d, err)
		}
	})
}

// flapping is a primary that goes away and comes back: it fails the calls of every other
// stretch of 13 calls (the breaker's probes among them), and counts how many times the
// store that decides changed hands (limitertest.Handovers).
type flapping struct {
	local        *localstore.Store
	calls, turns atomic.Int64
	mu           sync.Mutex
	down         bool
}

func (f *flapping) call() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	down := f.calls.Add(1)/13%2 == 1
	if down != f.down {
		f.down = down
		f.turns.Add(1)
	}
	if down {
		return errDown
	}
	return nil
}

func (f *flapping) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if err := f.call(); err != nil {
		return core.Outcome{}, err
	}
	return f.local.Apply(ctx, req)
}

func (f *flapping) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	if err := f.call(); err != nil {
		return nil, err
	}
	return f.local.Lend(ctx, loans)
}

// handing is a fallback over a flapping primary, which says how often it changed hands.
type handing struct {
	*fallback.Store
	primary *flapping
}

func (h handing) Handovers() int64 { return h.primary.turns.Load() }

// TestNothingCreatesAllowanceFlapping: a fallback whose primary goes away and comes back,
// again and again, runs the allowance property: one instance, so its share is the whole
// rule, mirrored from the primary's decisions while it decides; it admits no more than
// the rule plus one allowance per handover (the primary comes back not knowing what the
// share admitted), the documented bound of one instance.
func TestNothingCreatesAllowanceFlapping(t *testing.T) {
	limitertest.RunAllowance(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		p := &flapping{local: localstore.New(localstore.WithClock(clk))}
		return handing{fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk), fallback.WithTimeout(time.Minute)), p}
	})
}

// TestRefundOutlivesTheWait: a refund the primary answers after the timeout gives back
// nothing on the share (the take was the primary's: the share peeks), and the call that
// goes on after the wait is the refund it was sent as, whatever the share's peek did to
// the request meanwhile (run with -race: they shared it).
func TestRefundOutlivesTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		s := fallback.New(p, localstore.New(), fallback.WithTimeout(time.Millisecond))
		rule := ratelimit.PerHour(1000)
		take := req("k", rule)
		take.N, take.Receipt = 10, &core.Receipt{}
		if d, err := s.Apply(t.Context(), take); err != nil || !d.Allowed() {
			t.Fatal(d, err)
		}
		release := make(chan struct{})
		p.hangUntil(release)
		refund := take
		refund.Spec = &core.Spec{Algorithm: take.Spec.Algorithm, Rule: core.Rule(rule), Op: core.OpRefund}
		if _, err := s.Apply(t.Context(), refund); err != nil {
			t.Fatal(err)
		}
		p.heal()
		close(release)
		synctest.Wait() // the refund lands on the primary, late
		peek := req("k", rule)
		peek.Spec.Op = core.OpPeek
		if d, err := p.local.Apply(t.Context(), peek); err != nil || d.Remaining != 999 {
			t.Errorf("the primary after the late refund of 10: %+v, %v; want 999 left (1000, less the peek's 1)", d, err)
		}
	})
}
