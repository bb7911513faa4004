package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// TestSettleRetriedAfterALostReply: a Settle whose reply is lost (Redis paused past its
// context's deadline) returns an error, though its refund, or its debit, lands once Redis
// resumes; Settle called again at the same cost, as the error invites, settles nothing
// more. A retry of a settlement that never left lands.
func TestSettleRetriedAfterALostReply(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(redisstore.Recommended(&redis.Options{Addr: srv.Addr}))
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, redisstore.WithMaxBatch(1))
	ctx := context.Background()
	algs := []struct {
		name string
		new  func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (*ratelimit.AlgorithmLimiter, error)
	}{{"tokenbucket", tokenbucket.New}, {"fixedwindow", fixedwindow.New}, {"slidingwindow", slidingwindow.New}}
	for _, alg := range algs {
		t.Run(alg.name, func(t *testing.T) {
			l, err := alg.new(store, ratelimit.PerHour(100), ratelimit.WithNamespace("settle"))
			if err != nil {
				t.Fatal(err)
			}
			admitted := func(key string, n int) (got int) {
				for range n {
					c, d, err := l.Charge(ctx, key, 1) // with a receipt, as Middleware's decisions
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed && c != nil {
						got++
					}
				}
				return got
			}
			left := func(key string) int64 {
				d, err := l.PeekN(ctx, key, 1)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining + map[bool]int64{true: 1}[d.Allowed]
			}

			// a refund: 50 used, 50 charged and settled at 0
			if got := admitted("refund", 50); got != 50 {
				t.Fatalf("the first 50: %d admitted", got)
			}
			c, _, err := l.Charge(ctx, "refund", 50)
			if err != nil || c == nil {
				t.Fatalf("Charge(50) = %v, %v", c, err)
			}
			srv.Pause()
			lost, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err = c.Settle(lost, 0)
			cancel()
			srv.Resume()
			if err == nil {
				t.Fatal("a Settle whose reply never came back: no error")
			}
			redistest.Eventually(t, "the refund lands once Redis resumes", func() bool { return left("refund") == 50 })
			if got := admitted("refund", 60); got != 50 {
				t.Fatalf("after the refund landed: %d admitted of the 50 it gave back", got)
			}
			if _, err := c.Settle(ctx, 0); err != nil {
				t.Fatalf("the retry: %v", err)
			}
			if got := admitted("refund", 10); got != 0 {
				t.Errorf("a retried Settle gave back again: %d more admitted in the hour", got)
			}

			// a debit: 10 charged, and settled at 60
			c, _, err = l.Charge(ctx, "debit", 10)
			if err != nil || c == nil {
				t.Fatalf("Charge(10) = %v, %v", c, err)
			}
			srv.Pause()
			lost, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
			_, err = c.Settle(lost, 60)
			cancel()
			srv.Resume()
			if err == nil {
				t.Fatal("a Settle whose reply never came back: no error")
			}
			redistest.Eventually(t, "the debit lands once Redis resumes", func() bool { return left("debit") == 40 })
			if _, err := c.Settle(ctx, 60); err != nil {
				t.Fatalf("the retry: %v", err)
			}
			if got := left("debit"); got != 40 {
				t.Errorf("a retried Settle debited again: %d left of 100, charged 60; want 40", got)
			}
			if _, err := c.Settle(ctx, 70); err == nil {
				t.Error("a Charge settled twice: no error")
			}

			// a retry after more settlements of the key than it marks: never twice
			first, _, err := l.Charge(ctx, "many", 5)
			if err != nil || first == nil {
				t.Fatalf("Charge(5) = %v, %v", first, err)
			}
			srv.Pause()
			lost, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
			_, err = first.Settle(lost, 0)
			cancel()
			srv.Resume()
			if err == nil {
				t.Fatal("a Settle whose reply never came back: no error")
			}
			for range 12 {
				c, _, err := l.Charge(ctx, "many", 1)
				if err != nil || c == nil {
					t.Fatalf("Charge(1) = %v, %v", c, err)
				}
				if _, err := c.Settle(ctx, 0); err != nil {
					t.Fatal(err)
				}
			}
			redistest.Eventually(t, "every refund lands", func() bool { return left("many") == 100 })
			admitted("many", 100)
			if _, err := first.Settle(ctx, 0); err != nil {
				t.Fatalf("the retry: %v", err)
			}
			if got := left("many"); got != 0 {
				t.Errorf("a retried Settle, after 12 more settlements of its key, gave back %d", got)
			}

			// a settlement that never left: its retry lands
			c, _, err = l.Charge(ctx, "never", 30)
			if err != nil || c == nil {
				t.Fatalf("Charge(30) = %v, %v", c, err)
			}
			gone, cancel := context.WithCancel(ctx)
			cancel()
			if _, err := c.Settle(gone, 0); err == nil {
				t.Fatal("a Settle on an ended context: no error")
			}
			if _, err := c.Settle(ctx, 10); err == nil {
				t.Error("a retry at another cost: no error")
			}
			if _, err := c.Settle(ctx, 0); err != nil {
				t.Fatalf("the retry: %v", err)
			}
			if got := left("never"); got != 100 {
				t.Errorf("a retried Settle whose first attempt never left: %d left; want all 100 back", got)
			}
		})
	}
}
