package regions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/redisx"
	"github.com/redis/go-redis/v9"
)

// Refresh reads this region's weights from its Redis. On an error, the weights read
// before stay in force.
func (r *Regions) Refresh(ctx context.Context) error {
	m, err := r.readWeights(ctx, r.self)
	if err != nil {
		return fmt.Errorf("regions: region %s: reading its weights: %w", r.self, err)
	}
	r.weights.Store(&m)
	return nil
}

func (r *Regions) readWeights(ctx context.Context, region string) (map[string]weight, error) {
	v, err := readScript.Run(ctx, r.clients[region], []string{r.weightsKey()}).StringSlice()
	if err != nil {
		return nil, err
	}
	m := make(map[string]weight, len(v)/2)
	for i := 0; i+1 < len(v); i += 2 {
		var w weight
		if _, err := fmt.Sscanf(v[i+1], "%d:%d:%d:%d", &w.bucket, &w.old, &w.new, &w.effective); err == nil {
			m[v[i]] = w
		}
	}
	return m, nil
}

// Rebalance sets the weights of the current interval from the demand of the one before.
// An interval counts as current two seconds after it starts, or half an interval if
// shorter. By then the last flushes of the one before have landed. Rebalance acts only
// if this region leads and no other instance has done it. It also needs every region to
// have flushed since the interval before ended, until half an interval has passed. See
// Regions.
//
// It returns the weights it wrote, by family and region. It returns nil when it had
// nothing to do, or nothing yet. It returns an error when a region could not be read or
// written. Then nothing was written, or only lowered weights.
func (r *Regions) Rebalance(ctx context.Context) (map[string]map[string]int64, error) {
	if r.self != r.names[0] {
		return nil, nil
	}
	now := r.clock.Now()
	k := r.bucket(now.Add(-r.settle())) // the interval begun a settle ago: the demand before it has landed
	if ready, err := r.reported(ctx, k, now); err != nil || !ready {
		return nil, err // not yet: asked again at the next round
	}
	lock := redisx.RegionsLock(r.prefix, k)
	got, err := lockScript.Run(ctx, r.clients[r.self], []string{lock}, (2 * r.interval).Milliseconds()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("regions: taking the lock: %w", err)
	}
	if got == nil {
		return nil, nil // another instance has it
	}
	demand, current, err := r.readAll(ctx, k)
	if err != nil {
		return nil, err
	}
	out, writes := r.plan(k, now, demand, current)
	for _, wr := range writes {
		val := fmt.Sprintf("%d:%d:%d:%d", wr.w.bucket, wr.w.old, wr.w.new, wr.w.effective)
		if err := setWeightScript.Run(ctx, r.clients[wr.region], []string{r.weightsKey()}, wr.family, k, val).Err(); err != nil {
			return out, fmt.Errorf("regions: writing %s's weight of %s (the weights raised after it are not written): %w",
				wr.region, wr.family, err)
		}
	}
	return out, nil
}

// reported reports whether every region has flushed since interval k-1 ended, so that its
// demand of k-1 is all in: a region cut off from its Redis across the end of k-1 writes it
// when it reconnects, and until then its k-1 would read as empty. It is waited for half
// an interval from the start of k: a region silent that long has no instance to report.
func (r *Regions) reported(ctx context.Context, k int64, now time.Time) (bool, error) {
	if now.Sub(time.Unix(0, k*int64(r.interval))) >= r.interval/2 {
		return true, nil
	}
	all := true
	for _, name := range r.names { // every one read: a region that cannot be is an error
		n, err := reportedScript.Run(ctx, r.clients[name], []string{r.reportedKey(k)}).Int()
		if err != nil {
			return false, fmt.Errorf("regions: reading %s's reports: %w", name, err)
		}
		all = all && n > 0
	}
	return all, nil
}

// readAll reads every region's demand of interval k-1 (family -> region -> takes) and
// its weights.
func (r *Regions) readAll(ctx context.Context, k int64) (map[string]map[string]int64, map[string]map[string]weight, error) {
	demand := map[string]map[string]int64{}
	current := map[string]map[string]weight{}
	for _, name := range r.names {
		v, err := readScript.Run(ctx, r.clients[name], []string{r.demandKey(k - 1)}).StringSlice()
		if err != nil {
			return nil, nil, fmt.Errorf("regions: reading %s's demand: %w", name, err)
		}
		for i := 0; i+1 < len(v); i += 2 {
			n, _ := strconv.ParseInt(v[i+1], 10, 64)
			if demand[v[i]] == nil {
				demand[v[i]] = map[string]int64{}
			}
			demand[v[i]][name] = n
		}
		if current[name], err = r.readWeights(ctx, name); err != nil {
			return nil, nil, fmt.Errorf("regions: reading %s's weights: %w", name, err)
		}
	}
	return demand, current, nil
}

// weightWrite is a weight Rebalance writes to a region.
type weightWrite struct {
	region, family string
	w              weight
}

// plan moves each family's weights toward its demand: the weights by family and region,
// and the writes, the lowered ones first so that the weights never add up to more than
// the whole, each raised one effective only after the grace.
func (r *Regions) plan(k int64, now time.Time, demand map[string]map[string]int64, current map[string]map[string]weight) (map[string]map[string]int64, []weightWrite) {
	out := map[string]map[string]int64{}
	var lowered, raised []weightWrite
	for fam, d := range demand {
		cur := map[string]int64{}
		for _, name := range r.names {
			cur[name] = 1000 / int64(len(r.names))
			if w, ok := current[name][fam]; ok {
				cur[name] = w.new
			}
		}
		next := r.move(cur, d)
		out[fam] = next
		for _, name := range r.names {
			w := weight{bucket: k, old: cur[name], new: next[name], effective: now.UnixNano()}
			if next[name] > cur[name] {
				w.effective += int64(r.grace)
				raised = append(raised, weightWrite{name, fam, w})
			} else {
				lowered = append(lowered, weightWrite{name, fam, w})
			}
		}
	}
	return out, append(lowered, raised...)
}

// move is the weights after one interval: each region's current weight moved toward its
// share of demand, by at most the step, at least the floor, adding up to at most 1000.
func (r *Regions) move(cur, demand map[string]int64) map[string]int64 {
	total := int64(0)
	for _, name := range r.names {
		total += demand[name]
	}
	next := map[string]int64{}
	sum := int64(0)
	for _, name := range r.names {
		target := cur[name]
		if total > 0 {
			target = demand[name] * 1000 / total
		}
		target = max(target, r.floor)
		w := cur[name] + max(-r.step, min(r.step, target-cur[name]))
		next[name] = max(w, r.floor)
		sum += next[name]
	}
	for _, name := range slices.Backward(r.names) { // more than the whole: take back from the raised ones
		if sum <= 1000 {
			break
		}
		if back := min(sum-1000, next[name]-max(cur[name], r.floor)); back > 0 {
			next[name] -= back
			sum -= back
		}
	}
	return next
}

// settle is how far into an interval its rebalancing waits, for the last flushes of the
// interval before to land: two flushes, or half an interval when that is shorter.
func (r *Regions) settle() time.Duration { return min(2*r.flush, r.interval/2) }
