package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// slowLender is a primary that batches and lends too, each call as slow as its Apply.
type slowLender struct{ *primary }

func (b slowLender) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	b.calls.Add(1)
	if d := b.slow.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return b.local.(core.BatchStore).ApplyAll(context.WithoutCancel(ctx), reqs)
}

func (b slowLender) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	b.calls.Add(1)
	if d := b.slow.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if err := b.err.Load(); err != nil {
		return nil, *err
	}
	return b.local.(core.Lender).Lend(context.WithoutCancel(ctx), loans)
}

// counted is how many events st counts of key under rule: what a peek finds taken,
// against an untouched key's.
func counted(t *testing.T, st ratelimit.Store, key string, rule ratelimit.Rule) int64 {
	t.Helper()
	peek := req(key, rule)
	peek.Spec.Op = core.OpPeek
	d, err := st.Apply(context.Background(), peek)
	if err != nil {
		t.Fatal(err)
	}
	peek.Key = "untouched-" + key
	full, err := st.Apply(context.Background(), peek)
	if err != nil {
		t.Fatal(err)
	}
	return full.Remaining - d.Remaining
}

// TestSharesChargedToASlowPrimary: a primary that answers every call, but each after
// the breaker's Unanswered (a loaded host, or this process starved of CPU), opens the
// breaker; what the share admits while it is open (Apply's takes, ApplyAll's, Lend's
// partial takes) is charged to the primary, as debits, so that every instance reading
// the primary sees it. A denial whose late call the primary admitted stays counted
// there, one event each. Before, those admissions stayed on the share alone (34 of 100
// counted), and four tight loops admitted 1.04-1.26 of a key's rule. A take with a
// receipt stays on the share, where it is settled. An error (the primary down) replays
// nothing: see TestRedisRestarted.
func TestSharesChargedToASlowPrimary(t *testing.T) {
	for _, kind := range []string{"apply", "applyall", "lend"} {
		t.Run(kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := newPrimary()
				p.slow.Store(int64(150 * time.Millisecond))
				s := fallback.New(slowLender{p}, localstore.New(), fallback.WithTimeout(3*time.Millisecond), fallback.WithInstances(4))
				rule := ratelimit.PerHour(400)
				admitted, asked, opened := int64(0), int64(0), false
				for range 600 { // a decision every 5ms for 3s
					calls := p.calls.Load()
					var ok bool
					switch kind {
					case "apply":
						d, err := s.Apply(t.Context(), req("k", rule))
						if err != nil {
							t.Fatal(err)
						}
						ok = d.Allowed()
					case "applyall":
						ds, err := s.ApplyAll(t.Context(), []core.Request{req("k", rule), req("other", rule)})
						if err != nil {
							t.Fatal(err)
						}
						ok = ds[0].Allowed() && ds[1].Allowed()
					case "lend":
						lent, err := s.Lend(t.Context(), []core.Loan{{Key: "k", Spec: req("k", rule).Spec, Want: 1, Share: 1}})
						if err != nil {
							t.Fatal(err)
						}
						ok = lent[0].N == 1
					}
					if ok {
						admitted++
					} else if p.calls.Load() > calls {
						asked++ // denied, its call of the primary (a probe) late: the primary may have counted it
					}
					opened = opened || s.BreakerState() != fallback.Closed
					time.Sleep(5 * time.Millisecond)
				}
				if !opened {
					t.Fatal("the breaker never opened on a primary answering in 150ms")
				}
				if err := s.Flush(t.Context()); err != nil { // the late answers and the debts land
					t.Fatal(err)
				}
				if c := counted(t, p.local, "k", rule); c < admitted || c > admitted+asked {
					t.Errorf("the primary counted %d events, of %d admitted and %d denied late; want each admitted once, and the denied at most", c, admitted, asked)
				}
			})
		})
	}
}

// TestSettledWhereASlowPrimaryCounts: as TestSharesChargedToASlowPrimary, with takes of 3
// events, each with a receipt, settled at once at a cost of 1 (a budget charged after the
// answer), on a fixed window (which gives back a take's events exactly): what the share
// admits while the breaker is open is charged to the primary with a receipt of its own,
// and settled there. The primary ends counting 1 event for
// each take admitted, and for each denied whose late call it admitted, 3 at most. Before,
// those takes stayed on the share alone, settled there, and the primary counted none.
func TestSettledWhereASlowPrimaryCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		p.slow.Store(int64(150 * time.Millisecond))
		s := fallback.New(slowLender{p}, localstore.New(), fallback.WithTimeout(3*time.Millisecond), fallback.WithInstances(4))
		rule := ratelimit.PerHour(1200)
		admitted, asked, opened, shared := int64(0), int64(0), false, 0
		for range 600 { // a decision every 5ms for 3s
			calls := p.calls.Load()
			take := fwTake("k", 3, rule)
			d, err := s.Apply(t.Context(), take)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed() {
				admitted++
				if take.Receipt.Via == int64(fallback.Secondary) {
					shared++
				}
				refund := fwRefund(take, 2)
				go func() { // the answer comes later: the settlement does not hold the next request
					if _, err := s.Apply(context.Background(), refund); err != nil {
						t.Error(err)
					}
				}()
			} else if p.calls.Load() > calls {
				asked++
			}
			opened = opened || s.BreakerState() != fallback.Closed
			time.Sleep(5 * time.Millisecond)
		}
		if !opened || shared == 0 {
			t.Fatalf("breaker opened %v, %d takes admitted on the share; want both", opened, shared)
		}
		time.Sleep(10 * time.Second) // the late answers, the debts and the settlements land
		synctest.Wait()
		if c := fwCounted(t, p.local, "k", rule); c < admitted || c > admitted+3*asked {
			t.Errorf("the primary counted %d events, of %d takes admitted (%d on the share) and %d denied late; want 1 for each admitted, and 3 for each denied at most",
				c, admitted, shared, asked)
		}
	})
}

// TestResetForgivesTheSharesDebts: takes the share admitted while the breaker was
// half-open (its probe held by a slow primary) are owed to the primary; the probe's
// answer closes the breaker, and the key is reset at once. The debts are not charged
// after the reset: before, the key the caller reset was charged 3 events 10ms later.
// Found by an attacker.
func TestResetForgivesTheSharesDebts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		p.slow.Store(int64(150 * time.Millisecond))
		s := fallback.New(slowLender{p}, localstore.New(), fallback.WithTimeout(3*time.Millisecond),
			fallback.WithMaxTimeout(3*time.Millisecond), fallback.WithInstances(4))
		rule := ratelimit.PerHour(400)
		for i := 0; s.BreakerState() == fallback.Closed; i++ {
			if i > 1000 {
				t.Fatal("the breaker never opened on a primary answering in 150ms")
			}
			if _, err := s.Apply(t.Context(), req("k", rule)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		p.slow.Store(0)
		time.Sleep(1500 * time.Millisecond) // the late answers and the debts land
		synctest.Wait()
		release := make(chan struct{})
		p.hangUntil(release)
		go s.Apply(t.Context(), req("probe", rule)) // the breaker's probe, held by the primary
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if st := s.BreakerState(); st != fallback.HalfOpen {
			t.Fatalf("the breaker is %v with its probe out; want half-open", st)
		}
		for range 3 {
			if d, err := s.Apply(t.Context(), req("k", rule)); err != nil || !d.Allowed() {
				t.Fatalf("a take on the share while the probe is out: %+v, %v", d, err)
			}
		}
		p.heal()
		close(release)
		synctest.Wait()
		reset := req("k", rule)
		reset.Spec.Op = core.OpReset
		if _, err := s.Apply(t.Context(), reset); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if c := counted(t, p.local, "k", rule); c != 0 {
			t.Errorf("the key reset on the primary counts %d events taken before the reset; want 0", c)
		}
	})
}

// TestOutageNotReplayedAfterATimeout: the primary refuses a call (down), and a call sent
// before then times out after it: the breaker opens on both, and the latest failure is
// the timeout. What the share decides then is an outage's, and is not charged to the
// primary once it is back. Before, it was (TestRedisRestarted failed under -race with a
// second run beside it: a key used only while Redis was down was written into it).
func TestOutageNotReplayedAfterATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		s := fallback.New(slowLender{p}, localstore.New(), fallback.WithTimeout(3*time.Millisecond),
			fallback.WithMaxTimeout(3*time.Millisecond), fallback.WithInstances(4),
			fallback.WithBreaker(fallback.Breaker{MinCalls: 2, OpenFor: time.Hour}))
		rule := ratelimit.PerHour(400)
		p.slow.Store(int64(150 * time.Millisecond))
		go s.Apply(context.Background(), req("slow", rule)) // unanswered at 100ms, after the refusal
		time.Sleep(10 * time.Millisecond)
		p.slow.Store(0)
		down := errDown
		p.once.Store(&down)
		s.Apply(t.Context(), req("refused", rule))
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if st := s.BreakerState(); st != fallback.Open {
			t.Fatalf("the breaker is %v after a refusal and a timeout; want open", st)
		}
		for range 20 {
			if d, err := s.Apply(t.Context(), req("outage-only", rule)); err != nil || !d.Allowed() {
				t.Fatalf("the primary down: %+v, %v", d, err)
			}
		}
		time.Sleep(2 * time.Second) // what is owed is charged within payEvery
		synctest.Wait()
		if c := counted(t, p.local, "outage-only", rule); c != 0 {
			t.Errorf("the primary counts %d events of a key used only during the outage; want 0", c)
		}
	})
}

// TestRefundWaitsOutAnOutage: a take the primary counted, refunded while the breaker
// lets no call through (the primary down), is given back there once the breaker closes.
// Before, the refund was dropped, and the key stayed charged the whole take.
func TestRefundWaitsOutAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		s := fallback.New(p, localstore.New(), fallback.WithBreaker(fallback.Breaker{MinCalls: 1}), fallback.WithTimeout(time.Second))
		rule := ratelimit.PerHour(100)
		take := fwTake("k", 5, rule)
		if d, err := s.Apply(t.Context(), take); err != nil || !d.Allowed() || take.Receipt.Via != int64(fallback.Primary) {
			t.Fatalf("the take: %+v, %v, receipt %+v; want it admitted by the primary", d, err, take.Receipt)
		}
		p.fail(errDown)
		s.Apply(t.Context(), req("other", rule)) // opens the breaker
		if s.BreakerState() != fallback.Open {
			t.Fatalf("breaker %v; want open", s.BreakerState())
		}
		if _, err := s.Apply(t.Context(), fwRefund(take, 4)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := s.Flush(t.Context()); !errors.Is(err, ratelimit.ErrUnavailable) || time.Since(start) != 0 {
			t.Errorf("Flush with a refund owed through an outage: %v after %v; want ErrUnavailable at once", err, time.Since(start))
		}
		time.Sleep(fallback.DefaultOpenFor)
		p.heal()
		s.Apply(t.Context(), req("other", rule)) // the probe: closed
		if err := s.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		if c := fwCounted(t, p.local, "k", rule); c != 1 {
			t.Errorf("the primary counts %d of the key; want 1, the take less its refund", c)
		}
	})
}

// openSlow opens s's breaker on a primary whose answers take 150ms (calls unanswered):
// the breaker is open on a slow primary, not an outage, when it returns.
func openSlow(t *testing.T, s *fallback.Store, rule ratelimit.Rule) {
	t.Helper()
	for i := 0; s.BreakerState() == fallback.Closed; i++ {
		if i > 1000 {
			t.Fatal("the breaker never opened on a primary answering in 150ms")
		}
		if _, err := s.Apply(t.Context(), req("warm", rule)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fwCounted is how many events st counts of key under rule, a fixed window.
func fwCounted(t *testing.T, st ratelimit.Store, key string, rule ratelimit.Rule) int64 {
	t.Helper()
	peek := core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Rule: core.Rule(rule), Op: core.OpPeek}}
	o, err := st.Apply(context.Background(), peek)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Allowed() {
		return rule.Limit
	}
	return rule.Limit - 1 - o.Remaining
}

func fwTake(key string, n int64, rule ratelimit.Rule) core.Request {
	return core.Request{Key: key, N: n, Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Rule: core.Rule(rule)}, Receipt: &core.Receipt{}}
}

func fwRefund(take core.Request, n int64) core.Request {
	r := take
	r.N, r.Spec = n, &core.Spec{Algorithm: take.Spec.Algorithm, Rule: take.Spec.Rule, Op: core.OpRefund}
	return r
}

// TestApplyAllReceiptsChargedToASlowPrimary: takes with a receipt that the share
// admits through ApplyAll, while the breaker is open on a slow primary, are charged to
// the primary, as Apply's are. Before, the primary counted none of them. Found by an
// attacker.
func TestApplyAllReceiptsChargedToASlowPrimary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		p.slow.Store(int64(150 * time.Millisecond))
		s := fallback.New(slowLender{p}, localstore.New(), fallback.WithTimeout(3*time.Millisecond),
			fallback.WithMaxTimeout(3*time.Millisecond), fallback.WithInstances(4))
		rule := ratelimit.PerHour(400)
		openSlow(t, s, rule)
		var viaApply, viaApplyAll int64
		for range 10 {
			one := req("apply", rule)
			one.Receipt = &core.Receipt{}
			if d, err := s.Apply(t.Context(), one); err != nil {
				t.Fatal(err)
			} else if d.Allowed() {
				viaApply++
			}
			a, b := req("all-a", rule), req("all-b", rule)
			a.Receipt, b.Receipt = &core.Receipt{}, &core.Receipt{}
			if ds, err := s.ApplyAll(t.Context(), []core.Request{a, b}); err != nil {
				t.Fatal(err)
			} else if ds[0].Allowed() && ds[1].Allowed() {
				viaApplyAll++
			}
		}
		if s.BreakerState() == fallback.Closed {
			t.Fatal("the breaker closed")
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if c := counted(t, p.local, "apply", rule); c != viaApply {
			t.Errorf("Apply: the primary counts %d of %d takes with a receipt admitted on the share", c, viaApply)
		}
		if c := counted(t, p.local, "all-a", rule); c != viaApplyAll {
			t.Errorf("ApplyAll: the primary counts %d of %d takes with a receipt admitted on the share; want %d", c, viaApplyAll, viaApplyAll)
		}
	})
}

// TestSettlementDebitChargedToASlowPrimary: a Charge settled above its estimate (a
// debit naming the take's receipt), while the breaker is open on a slow primary, is
// charged to the primary too. Before, the share alone counted the rest of the cost.
// Found by an attacker.
func TestSettlementDebitChargedToASlowPrimary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		s := fallback.New(slowLender{p}, localstore.New(), fallback.WithTimeout(3*time.Millisecond),
			fallback.WithMaxTimeout(3*time.Millisecond), fallback.WithInstances(4))
		rule := ratelimit.PerHour(400)
		l, err := fixedwindow.New(s, rule, ratelimit.WithNamespace(""))
		if err != nil {
			t.Fatal(err)
		}
		early, d, err := l.Charge(t.Context(), "early", 1) // on the primary, the breaker closed
		if err != nil || early == nil || !d.Allowed {
			t.Fatalf("Charge: %v %+v %v", early, d, err)
		}
		p.slow.Store(int64(150 * time.Millisecond))
		openSlow(t, s, rule)
		late, d, err := l.Charge(t.Context(), "late", 1) // on the share, charged to the primary (oweTake)
		if err != nil || late == nil || !d.Allowed {
			t.Fatalf("Charge: %v %+v %v", late, d, err)
		}
		for _, c := range []*ratelimit.Charge{early, late} {
			if _, err := c.Settle(t.Context(), 10); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		for _, key := range []string{"early", "late"} {
			if c := fwCounted(t, p.local, key, rule); c != 10 {
				t.Errorf("%s: a charge of 1 settled at 10 while the breaker was open on a slow primary: the primary counts %d; want 10", key, c)
			}
		}
	})
}

// TestRefundOutlivesAResetInAnOutage: a refund of a take the primary counted, held back
// by an outage, is still given back after a reset of the key decided on the share alone
// (which never reached the primary). Before, the reset dropped it, and the primary kept
// the whole take. Found by an attacker.
func TestRefundOutlivesAResetInAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		s := fallback.New(p, localstore.New(), fallback.WithBreaker(fallback.Breaker{MinCalls: 1}), fallback.WithTimeout(time.Second))
		rule := ratelimit.PerHour(100)
		take := fwTake("k", 5, rule)
		if d, err := s.Apply(t.Context(), take); err != nil || !d.Allowed() || take.Receipt.Via != int64(fallback.Primary) {
			t.Fatalf("take: %+v %v %+v", d, err, take.Receipt)
		}
		p.fail(errDown)
		s.Apply(t.Context(), req("other", rule))
		if s.BreakerState() != fallback.Open {
			t.Fatal("breaker not open")
		}
		if _, err := s.Apply(t.Context(), fwRefund(take, 4)); err != nil {
			t.Fatal(err)
		}
		reset := fwTake("k", 1, rule)
		reset.Receipt, reset.Spec.Op = nil, core.OpReset
		if _, err := s.Apply(t.Context(), reset); err != nil {
			t.Fatal(err)
		}
		time.Sleep(fallback.DefaultOpenFor)
		p.heal()
		s.Apply(t.Context(), req("other", rule)) // the probe closes the breaker
		if s.BreakerState() != fallback.Closed {
			t.Fatal("breaker not closed")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if c := fwCounted(t, p.local, "k", rule); c > 1 {
			t.Errorf("a take of 5 refunded 4 (then the key reset, on the share alone) during an outage: the primary counts %d; want 1 (or 0)", c)
		}
	})
}

// errRefused is a call that never reached the primary (its connection refused).
var errRefused = fmt.Errorf("dial tcp: connection refused: %w: %w", core.ErrUndelivered, ratelimit.ErrUnavailable)

// dropOnce is a slow lending primary whose first debit with an unwritten receipt (an
// oweTake's) and first Lend (owe's debits) fail undelivered: neither reached it.
type dropOnce struct {
	slowLender
	take, lend atomic.Bool
}

func (d *dropOnce) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if req.Spec.Op == core.OpDebit && req.Receipt != nil && req.Receipt.At == 0 && d.take.CompareAndSwap(true, false) {
		return core.Outcome{}, errRefused
	}
	return d.slowLender.Apply(ctx, req)
}

func (d *dropOnce) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	if d.lend.CompareAndSwap(true, false) {
		return nil, errRefused
	}
	return d.slowLender.Lend(ctx, loans)
}

// TestUndeliveredTakeChargedAgain: a take with a receipt owed to a slow primary, whose
// debit never reached it, is charged again, as a take without one is. Before, it was
// settled on the share and forgotten. Found by an attacker.
func TestUndeliveredTakeChargedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		p.slow.Store(int64(150 * time.Millisecond))
		dp := &dropOnce{slowLender: slowLender{p}}
		s := fallback.New(dp, localstore.New(), fallback.WithTimeout(3*time.Millisecond),
			fallback.WithMaxTimeout(3*time.Millisecond), fallback.WithInstances(4))
		rule := ratelimit.PerHour(400)
		openSlow(t, s, rule)
		time.Sleep(200 * time.Millisecond) // the opening's late calls end
		synctest.Wait()
		if s.BreakerState() != fallback.Open {
			t.Fatal("breaker not open")
		}
		dp.take.Store(true)
		dp.lend.Store(true)
		with := req("with-receipt", rule)
		with.Receipt = &core.Receipt{}
		for _, r := range []core.Request{with, req("without", rule)} {
			if d, err := s.Apply(t.Context(), r); err != nil || !d.Allowed() {
				t.Fatalf("%+v %v", d, err)
			}
		}
		time.Sleep(time.Second) // payBack; then the breaker lets a probe through
		synctest.Wait()
		p.slow.Store(0)
		s.Apply(t.Context(), req("probe", rule))
		time.Sleep(time.Second)
		synctest.Wait()
		if s.BreakerState() != fallback.Closed {
			t.Fatalf("breaker %v", s.BreakerState())
		}
		if c := counted(t, p.local, "without", rule); c != 1 {
			t.Errorf("a take without a receipt, its debit undelivered once: the primary counts %d; want 1", c)
		}
		if c := counted(t, p.local, "with-receipt", rule); c != 1 {
			t.Errorf("a take with a receipt, its debit undelivered once: the primary counts %d; want 1", c)
		}
	})
}
