package limitertest

import (
	"context"
	"errors"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
)

// ruleLimiter is a limiter that also decides under a rule given per call: every
// algorithm's is.
type ruleLimiter interface {
	ratelimit.Limiter
	AllowRule(ctx context.Context, key string, rule ratelimit.Rule, n int64) (ratelimit.Decision, error)
}

// testNamespaces: two limiters on one store and one key count apart, unless they share
// the rule and no namespace was named, or name the same namespace.
func testNamespaces(t *testing.T, newStore NewStore, k Kind) {
	store := newStore(t, clock.NewFake(Start))
	ctx := context.Background()
	mk := func(rule ratelimit.Rule, opts ...ratelimit.Option) ratelimit.Limiter {
		t.Helper()
		l, err := k.New(store, rule, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	daily, perSecond := mk(ratelimit.PerDay(3)), mk(ratelimit.PerSecond(100))
	for range 3 {
		if d, err := daily.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("daily: %+v, %v", d, err)
		}
	}
	if d, err := perSecond.Allow(ctx, "k"); err != nil || !d.Allowed || d.Limit != 100 || d.Remaining != 99 {
		t.Errorf("per second after 3 daily: %+v, %v; want allowed with 99 of 100 left", d, err)
	}
	if d, _ := daily.Allow(ctx, "k"); d.Allowed {
		t.Errorf("daily, a 4th: %+v; want denied", d)
	}

	// the same rule: one count by default (the same limiter in every instance), apart
	// with names, together again under the same name
	rule := ratelimit.PerHour(5)
	a, b := mk(rule), mk(rule)
	logins, resets := mk(rule, ratelimit.WithNamespace("login")), mk(rule, ratelimit.WithNamespace("reset"))
	logins2 := mk(ratelimit.PerHour(6), ratelimit.WithNamespace("login"))
	a.AllowN(ctx, "k", 2)
	if d, _ := b.Allow(ctx, "k"); d.Remaining != 2 {
		t.Errorf("same rule, no names: %+v; want one count, 2 left", d)
	}
	logins.AllowN(ctx, "k", 4)
	if d, _ := resets.Allow(ctx, "k"); d.Remaining != 4 {
		t.Errorf("same rule, named apart: %+v; want 4 left", d)
	}
	if d, _ := logins2.Allow(ctx, "k"); !d.Allowed || d.Remaining > 1 { // a fresh key would have 5 left
		t.Errorf("one name, two rules: %+v; want the 4 taken under the name to count", d)
	}
	if _, err := k.New(store, rule, nil); err == nil {
		t.Error("a nil option: no error")
	}
}

// testRulePerCall: AllowRule decides under the rule it is given, in the limiter's
// namespace, so a key's count carries over when its rule changes; a bad rule or n is an
// error that consumes nothing.
func testRulePerCall(t *testing.T, newStore NewStore, k Kind) {
	clk := clock.NewFake(Start)
	l, err := k.New(newStore(t, clk), ratelimit.PerSecond(1), ratelimit.WithNamespace("plans"))
	if err != nil {
		t.Fatal(err)
	}
	rl, ok := l.(ruleLimiter)
	if !ok {
		t.Fatalf("%s's limiter has no AllowRule", k.Name)
	}
	ctx := context.Background()
	small, large := ratelimit.PerHour(3), ratelimit.PerHour(5)
	for i := range 4 {
		d, err := rl.AllowRule(ctx, "tenant", small, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 3) || d.Limit != 3 {
			t.Fatalf("request %d under %v: %+v", i, small, d)
		}
	}
	for _, bad := range []struct {
		rule ratelimit.Rule
		n    int64
		want error
	}{{ratelimit.Rule{}, 1, ratelimit.ErrInvalidRule}, {large, 0, ratelimit.ErrInvalidN}, {large, 6, ratelimit.ErrInvalidN}} {
		if _, err := rl.AllowRule(ctx, "tenant", bad.rule, bad.n); !errors.Is(err, bad.want) {
			t.Errorf("AllowRule(%v, n=%d): %v; want %v", bad.rule, bad.n, err, bad.want)
		}
	}
	// the plan grows: the 3 taken still count, and 2 more are admitted (a token bucket
	// keeps its whole tokens, none, and admits none until it refills)
	wantMore := 2
	if k.Name == "tokenbucket" {
		wantMore = 0
	}
	admitted := 0
	for range 5 {
		d, err := rl.AllowRule(ctx, "tenant", large, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Limit != 5 {
			t.Fatalf("under %v: %+v; want its limit, 5", large, d)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != wantMore {
		t.Errorf("after the plan grew from 3 to 5, %d more admitted; want %d", admitted, wantMore)
	}
	if d, err := l.Allow(ctx, "other"); err != nil || d.Limit != 1 {
		t.Errorf("Allow under the limiter's own rule: %+v, %v; want its limit, 1", d, err)
	}
}
