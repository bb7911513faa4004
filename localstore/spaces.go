package localstore

import (
	"errors"
	"fmt"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// errNoSpec is the error of a request without a Spec.
var errNoSpec = errors.New("localstore: request has no Spec")

// fewSpaces is how many spaces (most stores have one or two) are found by a scan and keep
// their tables in each shard's array, at their ordinal; the store keeps any more in maps,
// so that a store of a great many namespaces neither scans them nor gives every shard a
// slot for each.
const fewSpaces = 16

type spaceKey struct {
	alg *core.Algorithm
	ns  string
}

// space is one (algorithm, namespace): its keys are apart from every other space's.
type space struct {
	alg *core.Algorithm
	ns  string
	ord int
}

// table is one space's keys in one shard.
type table struct {
	alg  *core.Algorithm
	keys index
}

// space is the space of (alg, ns), added the first time it is asked for; an error for an
// algorithm this store cannot run.
func (s *Store) space(alg *core.Algorithm, ns string) (*space, error) {
	if sp := findSpace(s.spaces.few.Load(), alg, ns); sp != nil {
		return sp, nil
	}
	if err := checkAlgorithm(alg); err != nil {
		return nil, err
	}
	return s.spaces.add(alg, ns), nil
}

// checkAlgorithm is the error for an algorithm this store cannot run, or nil: a space is
// made only for one it can.
func checkAlgorithm(alg *core.Algorithm) error {
	if alg == nil {
		return errors.New("localstore: request has no algorithm")
	}
	if alg.Prepare == nil || alg.Step == nil || alg.Refund == nil {
		return fmt.Errorf("localstore: algorithm %q has no Prepare, Step or Refund", alg.Name)
	}
	return nil
}

func findSpace(few *[]*space, alg *core.Algorithm, ns string) *space {
	if few == nil {
		return nil
	}
	for _, sp := range *few {
		if sp.alg == alg && sp.ns == ns {
			return sp
		}
	}
	return nil
}

// add is the space of (alg, ns), made if it is new.
func (ss *spaces) add(alg *core.Algorithm, ns string) *space {
	key := spaceKey{alg, ns}
	if sp, ok := ss.more.Load(key); ok {
		return sp.(*space)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	old := ss.few.Load()
	if sp := findSpace(old, alg, ns); sp != nil {
		return sp
	}
	if sp, ok := ss.more.Load(key); ok {
		return sp.(*space)
	}
	sp := &space{alg: alg, ns: ns, ord: ss.n}
	ss.n++
	if sp.ord >= fewSpaces {
		ss.more.Store(key, sp)
		return sp
	}
	var few []*space
	if old != nil {
		few = *old
	}
	few = append(few[:len(few):len(few)], sp) // a new array: readers may hold the old one
	ss.few.Store(&few)
	return sp
}

// table is this shard's table of sp; sh.mu is held.
func (sh *shard) table(sp *space) *table {
	if sp.ord < fewSpaces {
		if t := sh.tables[sp.ord].Load(); t != nil {
			return t
		}
	}
	return sh.otherTable(sp)
}

// otherTable is table's slow path: a table of the many, or one the shard has not made.
func (sh *shard) otherTable(sp *space) *table {
	if sp.ord >= fewSpaces {
		if t := sh.more[sp]; t != nil {
			return t
		}
		if sh.more == nil {
			sh.more = make(map[*space]*table)
		}
		t := newTable(sp.alg)
		sh.more[sp] = t
		return t
	}
	t := newTable(sp.alg)
	sh.tables[sp.ord].Store(t)
	return t
}

func newTable(alg *core.Algorithm) *table { return &table{alg: alg} }
