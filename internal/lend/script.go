package lend

import (
	_ "embed"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/script"
)

// lua is lend.lua: Decide in Redis, over the steps of the loans' algorithms.
//
//go:embed lend.lua
var lua string

// Script is the script of loans (core.Lender) of algs, which redisstore sends: the
// step of algs[i] its (i+1)-th; on a cluster, with the keys of its loans in several slots
// of a node.
func Script(algs []*core.Algorithm, cluster bool) string {
	return script.Compose(algs, cluster, lua)
}

// The arguments of a loan in lend.lua, after its step's index and its step's
// script.Values (n 1, op take or debit, the holder as the lease, keep and taken 0): by
// their offset after those.
const (
	ArgGive = iota
	ArgWant
	ArgShare
	ArgTTL    // microseconds
	ArgRevoke // 1: Revoke; 2: End; else 0
	ArgWindow // 0: none; a period: the period-aligned window of now; -1: the calendar window of the step's arguments
	ArgOut    // Loan.Out
	ArgSeq    // Loan.Seq
	ArgState  // the name of the key's state
	ArgBook   // the name of its record of loans
	ArgFields // how many
)

// Reply is how many values lend.lua returns per loan: the five of a step's Outcome, then
// lent, for (microseconds), kept (1 or 0), out, and the instant of its take (0: none).
const Reply = 10
