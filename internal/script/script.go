// Package script is the protocol between this module's stores and the Lua scripts of its
// algorithms, and the composition of those scripts.
//
// An algorithm's Script (core.Algorithm) is its step alone: Lua that reads the
// arguments decode.lua names (n, limit, period, unit, rate, now, op, lease, keep and the
// window's three bounds), and, for an algorithm whose first key is named "state", the
// key's state T, L and A and the flags state.lua sets (dry, rewound); it sets allowed,
// remaining, retry, reset and delay, and writes its keys (save, refunded). The Go side
// sends the same arguments in the same order (Values, indexed by Field), with the
// operations as the codes of Op; a test holds the two sides together.
//
// Single composes the script that decides one request, Coalesced the batch of many calls
// redisstore sends in one round trip, AllOrNone the script of core.ApplyAll: each
// from .lua files of this package around the algorithms' own steps; Compose, another
// package's around them (internal/lend's script of loans).
package script

import (
	_ "embed"
	"strings"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Field is one argument of a step: its index in Values, and in ARGV less one.
type Field int

// The arguments of a step, in decode.lua's order.
const (
	N Field = iota
	Limit
	Period
	Unit
	Rate
	Now // microseconds since the Unix epoch; "" for Redis's own clock
	Op  // the operation's code (OpCode)
	Lease
	Keep
	WindowStart // the calendar window around the store's time, and the next (Algorithm.Window); "" for none
	WindowEnd
	WindowNext
	Taken  // core.Args.Taken: a refund's take, or TakenNow for a take with a receipt
	Fields // how many
)

// Names are the fields' names in Lua, as decode.lua declares them.
var Names = [Fields]string{"n", "limit", "period", "unit", "rate", "now", "op", "lease", "keep",
	"window_start", "window_end", "window_next", "taken"}

// Values are a step's arguments, by Field.
type Values [Fields]any

// The codes of the operations (core.Spec.Op), as prelude.lua names them. Probe and
// GiveBack are the script of loans' own (internal/lend): a refund that writes nothing
// (to learn what a refund would give back), and one that gives back a loan (which settles
// no take). RetryRefund and RetryDebit are a refund and a debit of Spec.Retry: a
// settlement tried again, applied only if the key's marks show no earlier attempt.
const (
	Take = iota
	Peek
	Refund
	Reset
	Extend
	Debit
	Probe
	RetryRefund
	RetryDebit
	GiveBack
)

// Reply is how many values a step returns (step.lua), in this order: allowed (0 or 1),
// remaining, retry, reset and delay (microseconds), the instant it decided a take at
// (the key's latest, after it: a Receipt's At), and what a refund gave back.
const Reply = 7

// Outcome is how many of a step's values make its Outcome: the first five.
const Outcome = 5

// TakenNow is Taken's value for a take with a receipt, as core.TakenNow and
// prelude.lua's TAKENNOW.
const TakenNow = -1

// Code is the code of sp's operation, and whether it is one of core.Spec.Op's: a
// refund's or a debit's of Spec.Retry is RetryRefund's or RetryDebit's.
func Code(sp *core.Spec) (int, bool) {
	code, ok := OpCode(sp.Op)
	switch {
	case !sp.Retry:
	case code == Refund:
		code = RetryRefund
	case code == Debit:
		code = RetryDebit
	}
	return code, ok
}

// OpCode is the code of op, and whether it is one of core.Op's: the codes follow
// its constants.
func OpCode(op core.Op) (int, bool) {
	return int(op), op <= core.OpDebit
}

var (
	//go:embed prelude.lua
	prelude string
	//go:embed decode.lua
	decode string
	//go:embed state.lua
	state string
	//go:embed step.lua
	stepFunc string
	//go:embed single.lua
	single string
	//go:embed coalesced.lua
	coalesced string
	//go:embed all.lua
	all string
	//go:embed cluster.lua
	clusterHead string
	//go:embed server.lua
	serverHead string
)

// ReadsState reports whether alg's first key holds the state "T:L:A" that state.lua
// reads before its step: it is named "state".
func ReadsState(alg *core.Algorithm) bool {
	return len(alg.ScriptKeys) > 0 && alg.ScriptKeys[0] == "state"
}

// Single is the script that decides one request of alg: ARGV its Values as strings.
func Single(alg *core.Algorithm) string {
	var b strings.Builder
	b.WriteString(prelude)
	writeStep(&b, alg)
	b.WriteString(single)
	return b.String()
}

// Coalesced is the batch script of calls of algs (coalesced.lua), the step of algs[i]
// its (i+1)-th; on a cluster, with its keys in several slots of a node.
func Coalesced(algs []*core.Algorithm, cluster bool) string {
	return compose(head(cluster), algs, coalesced)
}

// AllOrNone is the script of requests of algs decided all or none (all.lua), the step of
// algs[i] its (i+1)-th.
func AllOrNone(algs []*core.Algorithm) string {
	return compose("", algs, all)
}

// Compose is a script of calls to one node around the steps of algs: tail calls the
// step of algs[i] as its (i+1)-th; on a cluster, with its keys in several slots of the
// node. internal/lend composes the script of loans so.
func Compose(algs []*core.Algorithm, cluster bool, tail string) string {
	return compose(head(cluster), algs, tail)
}

// head is what a script of calls to one node starts with: on a cluster, what lets it
// reach keys in several slots of the node.
func head(cluster bool) string {
	if cluster {
		return clusterHead
	}
	return serverHead
}

// compose is a script of several steps: head, the prelude, the steps of algs in order,
// and tail, which calls them.
func compose(head string, algs []*core.Algorithm, tail string) string {
	var b strings.Builder
	b.WriteString(head)
	b.WriteString(prelude)
	for _, a := range algs {
		writeStep(&b, a)
	}
	b.WriteString(tail)
	return b.String()
}

// writeStep writes the step of alg as step.lua makes it: a function of its keys and
// arguments, with the prologue, and state.lua for an algorithm that reads its state.
func writeStep(b *strings.Builder, alg *core.Algorithm) {
	st, ahead := "", "false"
	if ReadsState(alg) {
		st, ahead = state, "true"
	}
	b.WriteString(strings.NewReplacer("--[[decode]]", decode, "--[[state]]", st, "--[[step]]", alg.Script,
		"--[[readsAhead]]", ahead).Replace(stepFunc))
}
