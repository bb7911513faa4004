package regions

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/redisx"
	"github.com/redis/go-redis/v9"
)

// count adds n takes of family to the demand of the interval now in: no lock once the
// family has a counter for it.
func (r *Regions) count(family string, n int64) {
	r.countIn(demandOf{family, r.bucket(r.clock.Now())}, n)
}

func (r *Regions) countIn(of demandOf, n int64) {
	c, ok := r.demand.Load(of)
	if !ok {
		c, _ = r.demand.LoadOrStore(of, new(atomic.Int64))
	}
	c.(*atomic.Int64).Add(n)
}

// bucket is the index of the interval of now.
func (r *Regions) bucket(now time.Time) int64 { return now.UnixNano() / int64(r.interval) }

// demandKey is the hash of interval bucket's demand in a region's Redis: a field per
// family, to which Flush adds with HINCRBY, one script for all of them.
func (r *Regions) demandKey(bucket int64) string { return redisx.RegionsDemand(r.prefix, bucket) }

func (r *Regions) weightsKey() string { return redisx.RegionsWeights(r.prefix) }

func (r *Regions) reportedKey(bucket int64) string { return redisx.RegionsReported(r.prefix, bucket) }

// The scripts of regions (their clients run scripts only: redis.Scripter).
var (
	//go:embed flush.lua
	flushSource string
	flushScript = redis.NewScript(flushSource)
	//go:embed setweight.lua
	setWeightSource string
	setWeightScript = redis.NewScript(setWeightSource)
	//go:embed read.lua
	readSource string
	readScript = redis.NewScript(readSource)
	//go:embed reported.lua
	reportedSource string
	reportedScript = redis.NewScript(reportedSource)
	//go:embed lock.lua
	lockSource string
	lockScript = redis.NewScript(lockSource)
)

// Flush adds the demand counted since the last flush to this region's Redis. Each take
// goes in the interval it was made in, however late the flush. So a region cut off from
// its Redis keeps its demand until it can add it. What Flush cannot add is kept for the
// next flush. Flush also marks the current interval as reported by this region. The
// leader waits for every region's report, up to half an interval, before it moves a
// weight (see Rebalance).
func (r *Regions) Flush(ctx context.Context) error {
	now := r.clock.Now()
	current := r.bucket(now)
	taken := map[demandOf]int64{}
	byBucket := map[int64][]any{}
	r.demand.Range(func(k, c any) bool {
		of := k.(demandOf)
		if n := c.(*atomic.Int64).Swap(0); n > 0 {
			taken[of] = n
			byBucket[of.bucket] = append(byBucket[of.bucket], of.family, n)
		} else if of.bucket < current {
			r.demand.CompareAndDelete(k, c) // an interval gone by, all flushed
		}
		return true
	})
	keys := []string{r.reportedKey(current)}
	args := []any{(3 * r.interval).Milliseconds(), now.UnixNano()}
	buckets := make([]int64, 0, len(byBucket))
	for b := range byBucket {
		buckets = append(buckets, b)
	}
	slices.Sort(buckets)
	for _, b := range buckets {
		keys = append(keys, r.demandKey(b))
		args = append(args, len(byBucket[b])/2)
		args = append(args, byBucket[b]...)
	}
	if err := flushScript.Run(ctx, r.clients[r.self], keys, args...).Err(); err != nil {
		for of, n := range taken {
			r.countIn(of, n)
		}
		return fmt.Errorf("regions: region %s: flushing its demand: %w", r.self, err)
	}
	return nil
}
