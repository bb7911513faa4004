package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

var _ ratelimit.BatchStore = (*Store)(nil)

// batchMain runs the steps (one per request, in order) first dry, writing nothing, and
// then, if every one is allowed, for real. ARGV: for each request, its number of keys,
// then n, limit, period, unit, rate and now, as a single step's ARGV; the steps get them
// as numbers, and an empty now as the one instant of Redis's clock the batch reads.
const batchMain = `
local keys, argvs, k, a, clock = {}, {}, 1, 1, nil
for i = 1, #steps do
  local nkeys = tonumber(ARGV[a])
  keys[i] = {}
  for j = 1, nkeys do
    keys[i][j] = KEYS[k]
    k = k + 1
  end
  local now = tonumber(ARGV[a + 6])
  if not now then
    if not clock then
      local t = redis.call('TIME')
      clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = clock
  end
  argvs[i] = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
    tonumber(ARGV[a + 5]), now, 'take'}
  a = a + 7
end
local out, all = {}, true
for i = 1, #steps do
  local dry = {unpack(argvs[i])}
  dry[7] = 'peek' -- the decision a take would give, writing nothing
  local d = {steps[i](keys[i], dry)}
  for j = 1, 5 do out[(i - 1) * 5 + j] = d[j] end
  if d[1] == 0 then all = false end
end
if all then
  for i = 1, #steps do
    local d = {steps[i](keys[i], argvs[i])}
    for j = 1, 5 do out[(i - 1) * 5 + j] = d[j] end
  end
end
return out
`

// ApplyAll takes every request or none. When all the keys share one hash tag (the same
// limiter key, or keys of one ratelimit.TaggedKey tag), or the client is a single
// *redis.Client, it is one script, atomic, in one round trip. Otherwise (keys on a Redis
// Cluster that may sit on different nodes) it counts nothing and returns an error
// matching errors.ErrUnsupported, and ratelimit.AllowAll takes them one by one: never a
// CROSSSLOT error.
func (s *Store) ApplyAll(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var names []string
	algs := make([]string, len(reqs))
	limits := make([]int64, len(reqs))
	var tail []any // ARGV
	now := s.now() // one instant for the whole batch
	for i, r := range reqs {
		alg := r.Algorithm
		if alg == nil || alg.Script == "" || len(alg.ScriptKeys) == 0 {
			return nil, errors.New("redisstore: request has no algorithm with a script")
		}
		if r.Op != ratelimit.OpTake || r.Algorithm.Extend != nil {
			return nil, errors.New("redisstore: ApplyAll only takes, and no leases")
		}
		a, err := alg.Prepare(r.Rule, r.N)
		if err != nil {
			return nil, err
		}
		pre, post := keyForm(r.Key)
		nsForm := namespaceForm(r.Namespace)
		for _, name := range s.script(alg).names {
			names = append(names, name+nsForm+pre+r.Key+post)
		}
		algs[i], limits[i] = alg.Name, a.Limit
		tail = append(tail, len(alg.ScriptKeys), a.N, a.Limit, a.Period, a.Unit, a.Rate, now)
	}
	if err := core.CheckDistinct("redisstore", reqs); err != nil {
		return nil, err
	}
	if !s.oneSlot(names) {
		return nil, fmt.Errorf("redisstore: the keys of a batch may sit on different cluster nodes: %w", errors.ErrUnsupported)
	}
	sc := s.batchScript(reqs, strings.Join(algs, ","))
	args := make([]any, 0, 3+len(names)+len(tail))
	args = append(args, "evalsha", sc.hash, len(names))
	for _, n := range names {
		args = append(args, n)
	}
	reply, err := s.run(ctx, sc, append(args, tail...))
	if err != nil {
		if unavailable(err) {
			s.nodeFailed()
			return nil, fmt.Errorf("redisstore: batch: %w: %w", ratelimit.ErrUnavailable, err)
		}
		return nil, fmt.Errorf("redisstore: batch: %w", err)
	}
	vals, ok := reply.([]any)
	if !ok || len(vals) != 5*len(reqs) {
		return nil, fmt.Errorf("%w: %v", ErrUnexpectedReply, reply)
	}
	ds := make([]ratelimit.Decision, len(reqs))
	for i := range reqs {
		if ds[i], err = decodeVals(vals[5*i:5*i+5], limits[i]); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// now is the time the scripts are given: the store's clock, or empty for Redis TIME.
func (s *Store) now() any {
	if s.clock == nil {
		return ""
	}
	return s.clock.Now().UnixMicro()
}

// oneSlot reports whether one script may touch all of names: on a single server always;
// elsewhere when they share a hash tag.
func (s *Store) oneSlot(names []string) bool {
	if _, single := s.client.(*redis.Client); single {
		return true
	}
	tag := hashTag(names[0])
	for _, n := range names[1:] {
		if hashTag(n) != tag || tag == "" {
			return false
		}
	}
	return true
}

// hashTag is what Redis Cluster hashes of a key's name: the text between the first "{"
// and the first "}" after it, if not empty; else "" (the whole name).
func hashTag(name string) string {
	open := strings.IndexByte(name, '{')
	if open < 0 {
		return ""
	}
	end := strings.IndexByte(name[open+1:], '}')
	if end <= 0 {
		return ""
	}
	return name[open+1 : open+1+end]
}

// batchScript is the script of a batch of these algorithms in this order, made once.
func (s *Store) batchScript(reqs []ratelimit.Request, id string) *script {
	if sc, ok := s.batches.Load(id); ok {
		return sc.(*script)
	}
	var b strings.Builder
	algs := make([]*ratelimit.Algorithm, len(reqs))
	for i, r := range reqs {
		algs[i] = r.Algorithm
	}
	writeSteps(&b, algs)
	b.WriteString(batchMain)
	rs := redis.NewScript(b.String())
	sc, _ := s.batches.LoadOrStore(id, &script{script: rs, source: b.String(), hash: rs.Hash(), src: b.String()})
	return sc.(*script)
}
