package script

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// The Lua side names the arguments as Names does, in the same order, each from its place.
func TestDecodeNamesTheFields(t *testing.T) {
	m := regexp.MustCompile(`(?s)local ([a-z_, ]+) =\s*(ARGV\[1\].*?)\n`).FindStringSubmatch(decode)
	if m == nil {
		t.Fatalf("decode.lua declares no arguments:\n%s", decode)
	}
	names := strings.Split(m[1], ", ")
	if len(names) != int(Fields) {
		t.Fatalf("decode.lua names %d arguments, Go %d", len(names), Fields)
	}
	for i, name := range names {
		if name != Names[i] {
			t.Errorf("argument %d: decode.lua %q, Go %q", i+1, name, Names[i])
		}
	}
	for i, src := range strings.Split(m[2], ", ") {
		if want := "ARGV[" + strconv.Itoa(i+1) + "]"; strings.TrimSpace(src) != want {
			t.Errorf("%s is read from %s, want %s", names[i], src, want)
		}
	}
}

// The operations have the same codes on both sides, and every Spec.Op has one.
func TestOpCodes(t *testing.T) {
	m := regexp.MustCompile(`local TAKE, PEEK, REFUND, RESET, EXTEND, DEBIT, PROBE, RETRYREFUND, RETRYDEBIT, GIVEBACK =\s+(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)`).FindStringSubmatch(prelude)
	if m == nil {
		t.Fatal("prelude.lua names no operations")
	}
	for i, want := range []int{Take, Peek, Refund, Reset, Extend, Debit, Probe, RetryRefund, RetryDebit, GiveBack} {
		if got, _ := strconv.Atoi(m[i+1]); got != want {
			t.Errorf("operation %d: Lua %d, Go %d", i, got, want)
		}
	}
	if m := regexp.MustCompile(`local TAKENNOW, DEFICITS, MININSTANT = (-?\d+), (\d+), (-?\d+)`).FindStringSubmatch(prelude); m == nil ||
		m[1] != strconv.Itoa(TakenNow) || m[2] != strconv.Itoa(core.DeficitsMax) || m[3] != strconv.FormatInt(core.MinInstant, 10) {
		t.Errorf("prelude.lua's TAKENNOW, DEFICITS and MININSTANT: %v; want %d, %d and %d as in Go", m, TakenNow, core.DeficitsMax, int64(core.MinInstant))
	}
	if TakenNow != core.TakenNow {
		t.Errorf("script.TakenNow %d, core.TakenNow %d", TakenNow, core.TakenNow)
	}
	for code, op := range map[int]core.Op{Take: core.OpTake, Peek: core.OpPeek, Refund: core.OpRefund,
		Reset: core.OpReset, Extend: core.OpExtend, Debit: core.OpDebit} {
		if got, ok := OpCode(op); !ok || got != code {
			t.Errorf("OpCode(%v) = %d, %v; want %d", op, got, ok, code)
		}
	}
	if _, ok := OpCode(core.OpDebit + 1); ok {
		t.Error("OpCode(OpDebit+1): an op no Spec has")
	}
}

// The scripts that decode arguments themselves keep the lease a string at its place, and
// know how many there are.
func TestArgumentPlaces(t *testing.T) {
	lease := strconv.Itoa(int(Lease) + 1)
	for name, src := range map[string]string{"single.lua": single, "all.lua": all} {
		if !strings.Contains(src, "if j == "+lease) && !strings.Contains(src, "if i == "+lease) {
			t.Errorf("%s does not keep argument %s, the lease, a string", name, lease)
		}
	}
	if !strings.Contains(all, "for j = 1, "+strconv.Itoa(int(Fields))+" do") ||
		!strings.Contains(all, "a = a + "+strconv.Itoa(2+int(Fields))) {
		t.Errorf("all.lua does not read %d arguments a request", Fields)
	}
	if !strings.Contains(coalesced, "a = a + "+strconv.Itoa(2+int(Fields))) ||
		!strings.Contains(coalesced, "ARGV[a + "+strconv.Itoa(1+int(Fields))+"]") {
		t.Errorf("coalesced.lua does not read profiles of %d arguments", Fields)
	}
}

// Composition fills every place of step.lua, reads the state only for an algorithm whose
// first key is "state", and heads a cluster's batch with its flags.
func TestCompose(t *testing.T) {
	rate := &core.Algorithm{Name: "r", Script: "allowed = 1 -- rate\n", ScriptKeys: []string{"state"}}
	leases := &core.Algorithm{Name: "l", Script: "allowed = 1 -- leases\n", ScriptKeys: []string{"leases"}}
	for name, src := range map[string]string{"Single": Single(rate), "Coalesced": Coalesced([]*core.Algorithm{rate, leases}, false),
		"AllOrNone": AllOrNone([]*core.Algorithm{rate}), "cluster": Coalesced([]*core.Algorithm{rate}, true)} {
		if strings.Contains(src, "--[[") {
			t.Errorf("%s leaves a place unfilled:\n%s", name, src)
		}
		if !strings.Contains(src, "-- rate") || !strings.Contains(src, "readsAhead[#steps] = true") {
			t.Errorf("%s lacks the step, or its state", name)
		}
	}
	if s := Single(leases); strings.Contains(s, "redis.call('GET', KEYS[1])") || !strings.Contains(s, "readsAhead[#steps] = false") {
		t.Error("a step of leases reads a state")
	}
	if c := Coalesced([]*core.Algorithm{rate}, true); !strings.HasPrefix(c, "#!lua flags=allow-cross-slot-keys\n") {
		t.Error("a cluster's batch does not start with its flags")
	}
}

// The scripts bound a debt where Go does.
func TestMaxDebt(t *testing.T) {
	if want := "local MAXDEBT = " + strconv.FormatInt(mathx.MaxExact, 10); !strings.Contains(prelude, want) {
		t.Errorf("prelude.lua: want %q", want)
	}
}
