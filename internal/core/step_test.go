package core_test

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/fast"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

func TestOutcomeDecision(t *testing.T) {
	allowed := fast.Outcome{Allowed: true, Remaining: 3, Wait: 2 * time.Second, ResetAfter: 5 * time.Second}
	want := ratelimit.Decision{Allowed: true, Limit: 10, Remaining: 3, Delay: 2 * time.Second, ResetAfter: 5 * time.Second}
	if got := core.Decision(allowed, 10); got != want {
		t.Errorf("allowed: %+v, want %+v", got, want)
	}
	if back := core.Outcome(want); back != allowed {
		t.Errorf("allowed, back: %+v, want %+v", back, allowed)
	}
	denied := fast.Outcome{Wait: time.Second, ResetAfter: 4 * time.Second}
	want = ratelimit.Decision{Limit: 7, RetryAfter: time.Second, ResetAfter: 4 * time.Second}
	if got := core.Decision(denied, 7); got != want {
		t.Errorf("denied: %+v, want %+v", got, want)
	}
	if back := core.Outcome(want); back != denied {
		t.Errorf("denied, back: %+v, want %+v", back, denied)
	}
}

// StepOf is the registered step of this module's algorithms, and a third party's Step
// (here a copy of the token bucket whose Step counts its calls) taken apart.
func TestStepOf(t *testing.T) {
	tb := tokenbucket.Algorithm()
	a, err := tb.Prepare(ratelimit.PerSecond(2), 1)
	if err != nil {
		t.Fatal(err)
	}
	var own, public ratelimit.State
	if got, want := core.StepOf(tb)(&own, 1e6, a), core.Outcome(tb.Step(&public, 1e6, a)); got != want || own != public {
		t.Fatalf("StepOf: %+v and %+v; Step: %+v and %+v", got, own, want, public)
	}
	calls := 0
	copied := *tb
	copied.Step = func(st *ratelimit.State, now int64, a ratelimit.Args) ratelimit.Decision {
		calls++
		return tb.Step(st, now, a)
	}
	var st ratelimit.State
	for range 3 {
		core.StepOf(&copied)(&st, 1e6, a)
	}
	if o := core.StepOf(&copied)(&st, 1e6, a); calls != 4 || o.Allowed || o.Wait != 500*time.Millisecond {
		t.Fatalf("a copy's StepOf: %d calls, then %+v; want 4 calls and a denial with Wait 500ms", calls, o)
	}
}
