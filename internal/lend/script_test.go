package lend

import (
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/script"
)

// lend.lua reads a loan where the Go side puts it: the step's index, its Values (the
// lease a string), then the loan's own fields in ArgFields' order, Reply values back.
func TestScriptPlaces(t *testing.T) {
	if want := "local stride, clock, out, o = " + strconv.Itoa(1+int(script.Fields)+ArgFields); !strings.Contains(lua, want) {
		t.Errorf("lend.lua's stride: want %q", want)
	}
	if want := "if j == " + strconv.Itoa(int(script.Lease)+1); !strings.Contains(lua, want) {
		t.Errorf("lend.lua's lease: want %q", want)
	}
	at := func(f int) string { return "ARGV[a + " + strconv.Itoa(int(script.Fields)+1+f) + "]" }
	for f, reads := range map[int]string{
		ArgGive: "give, want, share = tonumber(" + at(ArgGive) + "), tonumber(" + at(ArgWant) + "), tonumber(" + at(ArgShare) + ")",
		ArgTTL: "ttl, revoke, ending, win = tonumber(" + at(ArgTTL) + "), " + at(ArgRevoke) + " == '1', " + at(ArgRevoke) + " == '2', tonumber(" +
			at(ArgWindow) + ")",
		ArgState:  "keys, book = {" + at(ArgState) + "}, " + at(ArgBook),
		ArgFields: "redis.call('EXISTS', " + at(ArgState) + ", " + at(ArgBook) + ")",
	} {
		if !strings.Contains(lua, reads) {
			t.Errorf("field %d: lend.lua does not read %s", f, reads)
		}
	}
	if !strings.Contains(lua, "o = o + "+strconv.Itoa(Reply)) {
		t.Errorf("lend.lua returns other than %d values a loan", Reply)
	}
	if !strings.Contains(lua, "argv[7] == DEBIT") {
		t.Error("lend.lua does not read a partial take's debit from its step's op")
	}
}
