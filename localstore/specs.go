package localstore

import (
	"sync/atomic"
	"unsafe"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// specs remembers what a decision derives from each Spec the store has seen lately: its
// space, and its Args but n (its rule's, with what its reserve keeps and its lease). A
// limiter makes its Specs once and sends the same ones again and again, so a decision
// finds both by the Spec's address alone. Two slots per address, a pair chosen by a hash
// of it: a Spec takes the pair's slot that is free, else the second, whose Spec is
// derived anew when it comes back. (With one slot, two Specs of one limiter's that met
// in it, one time in 64, took it from each other at every decision, and each decision
// allocated.)
type specs [specSlots]atomic.Pointer[known]

const specSlots = 64

// known is what a store derived from spec. A Spec must not change once a request has
// carried it (see core.Request), and known holds on to it: its address names it
// while it is known.
type known struct {
	spec  *core.Spec
	space *space
	args  core.Args // with N 1
}

// find is what the store knows of spec, or nil.
func (c *specs) find(spec *core.Spec) *known {
	i := c.pair(spec)
	if k := c[i].Load(); k != nil && k.spec == spec {
		return k
	}
	if k := c[i+1].Load(); k != nil && k.spec == spec {
		return k
	}
	return nil
}

// pair is the first of the two slots of spec.
func (c *specs) pair(spec *core.Spec) int {
	const fib = 0x9E3779B97F4A7C15 // spreads the addresses of small objects over the slots
	return int(uint64(uintptr(unsafe.Pointer(spec)))*fib>>(64-5)) * 2
}

// remember keeps k in its Spec's pair: in the first slot when it is free, else the second.
func (c *specs) remember(k *known) {
	i := c.pair(k.spec)
	if c[i].CompareAndSwap(nil, k) {
		return
	}
	c[i+1].Store(k)
}

// know derives what a decision needs from spec, checks it (the error of an invalid one),
// and remembers it.
func (s *Store) know(spec *core.Spec) (*known, error) {
	if spec == nil {
		return nil, errNoSpec
	}
	sp, err := s.space(spec.Algorithm, spec.Namespace)
	if err != nil {
		return nil, err
	}
	a, err := core.Request{N: 1, Spec: spec}.Args()
	if err != nil {
		return nil, err
	}
	k := &known{spec: spec, space: sp, args: a}
	s.specs.remember(k)
	return k, nil
}
