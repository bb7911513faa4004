package redisstore

import (
	"errors"
	"fmt"
	"hash/maphash"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/redis/go-redis/v9"
)

func TestWithPrefixDropsBraces(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never called
	defer client.Close()
	s := New(client, WithPrefix("{app}"))
	if s.prefix != "(app)" {
		t.Errorf("prefix %q; want (app)", s.prefix)
	}
	if s := New(client, WithPrefix("")); s.prefix != DefaultPrefix {
		t.Errorf("empty prefix: %q; want the default", s.prefix)
	}
}

func TestDecode(t *testing.T) {
	d, at, err := decode([]any{int64(1), int64(4), int64(0), int64(1500), int64(250), int64(1767225600000000), int64(0)}, 5)
	want := core.Args{Limit: 5}.Outcome(true, 4, 250*time.Microsecond, 1500*time.Microsecond)
	if err != nil || d != want || at != 1767225600000000 {
		t.Errorf("decode = %+v, %d, %v; want %+v at 1767225600000000", d, at, err, want)
	}
	for _, bad := range []any{
		nil, "OK", int64(1), []any{},
		[]any{int64(1), int64(4), int64(0), int64(0), int64(0)},
		[]any{int64(1), int64(4), int64(0), int64(0), int64(0), int64(0)},
		[]any{int64(1), int64(4), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0)},
		[]any{"1", int64(4), int64(0), int64(0), int64(0), int64(0), int64(0)},
		[]any{int64(2), int64(4), int64(0), int64(0), int64(0), int64(0), int64(0)},
		[]any{int64(0), int64(-1), int64(0), int64(0), int64(0), int64(0), int64(0)},
		[]any{int64(0), int64(4), int64(-5), int64(0), int64(0), int64(0), int64(0)},
		[]any{int64(0), int64(4), 1.5, int64(0), int64(0), int64(0), int64(0)},
		[]any{int64(0), int64(4), int64(0), int64(0), int64(0), nil, int64(0)},
	} {
		if _, _, err := decode(bad, 5); !errors.Is(err, ErrUnexpectedReply) {
			t.Errorf("decode(%#v) = %v; want ErrUnexpectedReply", bad, err)
		}
	}
}

// TestFirstKeys: a batch's keys are "distinct" only when no two are the same; past what
// the table holds, they are not known distinct.
func TestFirstKeys(t *testing.T) {
	seed := maphash.MakeSeed()
	check := func(name string, keys []string, want bool) {
		t.Helper()
		var f firstKeys
		for _, k := range keys {
			f.add(seed, k)
		}
		if f.distinct() != want {
			t.Errorf("%s: distinct %t; want %t", name, f.distinct(), want)
		}
	}
	var many []string
	for i := range DefaultMaxBatch {
		many = append(many, fmt.Sprint("key-", i))
	}
	check("none", nil, true)
	check("one", []string{"a"}, true)
	check("distinct", many, true)
	check("a key twice", append(many[:10:10], "key-3"), false)
	check("the last twice", append(many[:len(many):len(many)], many[len(many)-1]), false)
	check("more than the table holds", append(many[:len(many):len(many)], "x"), false)
}

// TestFlagsMissing: only an old server's refusal of the shebang line turns coalescing off
// on a cluster; any other error compiling a batch script is the store's, returned as it
// is.
func TestFlagsMissing(t *testing.T) {
	for msg, want := range map[string]bool{
		"ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'": true,
		"ERR Unknown lua shebang option: flags":                                                true,
		"ERR Error compiling script (new function): user_script:57: '=' expected near 'x'":     false,
		"ERR Error running script (call to f_...): @user_script:12: attempt to index a nil":    false,
	} {
		if got := flagsMissing(errors.New(msg)); got != want {
			t.Errorf("flagsMissing(%q) = %v; want %v", msg, got, want)
		}
	}
}
