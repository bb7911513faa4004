package fallback_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// lateSetup is a fallback whose primary answers 8ms late, past a 5ms timeout, so that
// every take is decided on the share (one instance: the whole rule) while the primary
// counts it too; and a way to read what a store has left of a key.
func lateSetup(t *testing.T) (*fallback.Store, *primary, ratelimit.Store, func(s ratelimit.Store, key string) int64) {
	p := newPrimary()
	p.slow.Store(int64(8 * time.Millisecond))
	share := localstore.New()
	s := fallback.New(batching{p}, share, fallback.WithTimeout(5*time.Millisecond), fallback.WithMaxTimeout(5*time.Millisecond))
	left := func(store ratelimit.Store, key string) int64 {
		peek := req(key, ratelimit.PerHour(100))
		peek.Spec.Op = core.OpPeek
		d, err := store.Apply(context.Background(), peek)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed() {
			return 0
		}
		return d.Remaining + 1
	}
	return s, p, share, left
}

// batching is a primary that decides several limits at once.
type batching struct{ *primary }

func (b batching) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	if d := b.slow.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return b.local.(core.BatchStore).ApplyAll(ctx, reqs)
}

// TestLateTakeCountedOnce: a take the primary answers after the timeout is decided on
// the share, and the primary, which every instance reads, counts it once, at what it
// cost: the share's take stands as the mirror of the primary's (as for a decision the
// primary answers in time), and the take's settlement goes to the primary. A take the
// share denied and the primary admitted late is given back to the primary when it
// carries a receipt.
func TestLateTakeCountedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, p, share, left := lateSetup(t)
		ctx := t.Context()
		rule := ratelimit.PerHour(100)
		settle := func() {
			time.Sleep(50 * time.Millisecond) // the primary's late answer, and what follows it
			synctest.Wait()
		}

		take := req("plain", rule)
		take.N = 10
		if d, err := s.Apply(ctx, take); err != nil || !d.Allowed() {
			t.Fatalf("a take: %+v, %v", d, err)
		}
		settle()
		if got, on := left(p.local, "plain"), left(share, "plain"); got != 90 || on != 90 {
			t.Errorf("a take of 10 decided on the share, the primary late: %d left on the primary, %d on the share; want 90 on each", got, on)
		}

		l, err := tokenbucket.New(s, rule, ratelimit.WithNamespace(""))
		if err != nil {
			t.Fatal(err)
		}
		c, d, err := l.Charge(ctx, "charge", 10)
		if err != nil || c == nil || !d.Allowed {
			t.Fatalf("Charge(10) = %v, %+v, %v", c, d, err)
		}
		settle()
		p.slow.Store(0)
		if _, err := c.Settle(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if got, on := left(p.local, "charge"), left(share, "charge"); got != 97 || on != 90 {
			t.Errorf("a charge of 10 decided on the share, the primary late, settled at 3: %d left on the primary, %d on the share; want 97, and the mirror's 90", got, on)
		}

		// the share would deny (its key spent while the primary could not see it): the
		// decision waits for the primary a while longer, and its admission is the decision
		p.slow.Store(int64(8 * time.Millisecond))
		spend := req("denied", rule)
		spend.N = 100
		if _, err := share.Apply(ctx, spend); err != nil {
			t.Fatal(err)
		}
		c, d, err = l.Charge(ctx, "denied", 10)
		if err != nil || !d.Allowed || c == nil {
			t.Fatalf("Charge(10) on a spent share, the primary 8ms late: %+v, %v; want the primary's admission", d, err)
		}
		settle()
		if _, err := c.Settle(ctx, 4); err != nil {
			t.Fatal(err)
		}
		if got := left(p.local, "denied"); got != 96 {
			t.Errorf("a charge admitted by the primary after the share would deny, settled at 4: %d left on the primary; want 96", got)
		}
		// a primary later than that: the share's denial is the decision, and a take with a
		// receipt the primary admitted is given back there
		p.slow.Store(int64(300 * time.Millisecond))
		spend.Key = "later"
		if _, err := share.Apply(ctx, spend); err != nil {
			t.Fatal(err)
		}
		if _, d, err := l.Charge(ctx, "later", 10); err != nil || d.Allowed {
			t.Fatalf("Charge(10) on a spent share, the primary 300ms late: %+v, %v; want denied", d, err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := left(p.local, "later"); got != 100 {
			t.Errorf("a charge the share denied and the primary admitted 300ms late: %d left on the primary; want 100", got)
		}

		// the share admits what the primary, too late, denies (its key spent there), or
		// never receives (the call was still queued at its send-by time): the primary is
		// charged what the share admitted, and a charge's settlement goes there
		spent := req("owed", rule)
		spent.N = 100
		if _, err := p.local.Apply(ctx, spent); err != nil {
			t.Fatal(err)
		}
		p.slow.Store(int64(8 * time.Millisecond))
		owed := req("owed", rule)
		owed.N = 10
		if d, err := s.Apply(ctx, owed); err != nil || !d.Allowed() {
			t.Fatalf("a take the share admits: %+v, %v", d, err)
		}
		settle()
		debit := req("owed", rule)
		debit.Spec.Op = core.OpPeek
		if d, err := p.local.Apply(ctx, debit); err != nil || d.Allowed() || d.Wait < 10*36*time.Second {
			t.Errorf("a take of 10 the share admitted and the primary denied late: the primary's key %+v, %v; want it owing the 10 (denied for 396s at least)", d, err)
		}
		notSent := core.ErrNotSent
		p.once.Store(&notSent)
		c, _, err = l.Charge(ctx, "unsent", 10)
		if err != nil || c == nil {
			t.Fatalf("Charge(10) = %v, %v", c, err)
		}
		settle()
		p.slow.Store(0)
		if _, err := c.Settle(ctx, 4); err != nil {
			t.Fatal(err)
		}
		if got := left(p.local, "unsent"); got != 96 {
			t.Errorf("a charge of 10 the primary never received, settled at 4: %d left on the primary; want 96", got)
		}

		// several limits at once
		reqs := []core.Request{req("all-a", rule), req("all-b", rule)}
		reqs[1].Receipt = &core.Receipt{}
		reqs[1].N = 5
		if ds, err := s.ApplyAll(ctx, reqs); err != nil || !ds[0].Allowed() || !ds[1].Allowed() {
			t.Fatalf("ApplyAll: %+v, %v", ds, err)
		}
		settle()
		p.slow.Store(0)
		refund := reqs[1]
		refund.N, refund.Spec = 5, &core.Spec{Algorithm: refund.Spec.Algorithm, Rule: core.Rule(rule), Op: core.OpRefund}
		if _, err := s.Apply(ctx, refund); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string][2]int64{"all-a": {99, 99}, "all-b": {100, 95}} {
			if got, on := left(p.local, key), left(share, key); got != want[0] || on != want[1] {
				t.Errorf("%s, decided with another on the share, the primary late: %d left on the primary, %d on the share; want %d and %d", key, got, on, want[0], want[1])
			}
		}
	})
}

// TestShareDecisionsReportTheRule: a decision on a share tells the client the rule's
// Limit, not the share's: 60 a minute over 4 instances says 60.
func TestShareDecisionsReportTheRule(t *testing.T) {
	p := newPrimary()
	p.fail(errDown)
	s := fallback.New(p, localstore.New(), fallback.WithInstances(4))
	l, err := tokenbucket.New(s, ratelimit.PerMinute(60))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		d, err := l.Allow(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if want := (ratelimit.Decision{Allowed: i < 15, Limit: 60, Remaining: max(0, 14-int64(i))}); d.Allowed != want.Allowed || d.Limit != 60 || d.Remaining != want.Remaining {
			t.Fatalf("decision %d on a share of 15: %+v; want %+v", i, d, want)
		}
	}
}

// slowLending is a primary that lends, each loan answered slow late.
type slowLending struct{ *primary }

func (l slowLending) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	if d := l.slow.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	if err := l.err.Load(); err != nil {
		return nil, *err
	}
	return l.local.(core.Lender).Lend(ctx, loans)
}

// TestChargesWaitForThePrimary: partial debits (the charges of events admitted before
// they were counted, as hotkey.Leases sends) are no decisions: they wait for a primary
// slower than the timeout and are counted there, mirrored onto the share; while the
// primary is down, they go to the share alone.
func TestChargesWaitForThePrimary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPrimary()
		p.slow.Store(int64(8 * time.Millisecond))
		share := localstore.New()
		s := fallback.New(slowLending{p}, share, fallback.WithTimeout(5*time.Millisecond), fallback.WithMaxTimeout(5*time.Millisecond))
		rule := ratelimit.PerHour(100)
		debit := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule), Op: core.OpDebit}
		charge := func() {
			t.Helper()
			lent, err := s.Lend(t.Context(), []core.Loan{{Key: "k", Spec: debit, Want: 10}})
			if err != nil || len(lent) != 1 || lent[0].N != 10 {
				t.Fatalf("a charge of 10: %+v, %v", lent, err)
			}
		}
		left := func(store ratelimit.Store) int64 {
			peek := req("k", rule)
			peek.Spec.Op = core.OpPeek
			d, _ := store.Apply(t.Context(), peek)
			return d.Remaining + 1
		}
		charge()
		if on, mirror := left(p.local), left(share); on != 90 || mirror != 90 {
			t.Errorf("a charge of 10 on a slow primary: %d left there, %d on the share; want 90 on each", on, mirror)
		}
		p.fail(errDown)
		charge()
		if on, mirror := left(p.local), left(share); on != 90 || mirror != 80 {
			t.Errorf("a charge of 10 with the primary down: %d left there, %d on the share; want 90 and 80", on, mirror)
		}
	})
}
