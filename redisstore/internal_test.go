package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
)

func TestKeyForm(t *testing.T) {
	for _, tc := range []struct{ key, form, tag string }{
		{"tenant-42", "{tenant-42}", "tenant-42"},
		{"a:b", "{a:b}", "a:b"},
		{"{shop-a}:create-order", "t:{shop-a}:create-order", "shop-a"},
		{"x{shop-a}y{z}", "t:x{shop-a}y{z}", "shop-a"},
		{"}{a}", "t:}{a}", "a"},
		{"{a}", "t:{a}", "a"},
		{"a", "{a}", "a"},
		{"", "{cbf29ce484222325}:", "cbf29ce484222325"},
		{"{}", "{" + fnv64a("{}") + "}:{}", fnv64a("{}")},
		{"a}", "{" + fnv64a("a}") + "}:a}", fnv64a("a}")},
		{"{", "{" + fnv64a("{") + "}:{", fnv64a("{")},
	} {
		pre, post := keyForm(tc.key)
		form := pre + tc.key + post
		if form != tc.form {
			t.Errorf("keyForm(%q) = %q; want %q", tc.key, form, tc.form)
		}
		for _, part := range []string{"state", "log"} {
			if tag := hashTag("rl:slidinglog:" + part + ":" + form); tag != tc.tag {
				t.Errorf("key %q, part %s: hash tag %q; want %q", tc.key, part, tag, tc.tag)
			}
		}
	}
}

// TestKeysDistinct: no two keys share a name, and every name has a hash tag (so all the
// parts of a key sit in one slot), whatever the key.
func TestKeysDistinct(t *testing.T) {
	keys := []string{"", "a", "{a}", "a}", "{a", "{}", "}", "{", "a:b", "a:b:c", "{a}:b", "a\x00",
		"\x00", "\xff\xfe", "t:a", "{t:a}", "t:{a}", "{cbf29ce484222325}:", strings.Repeat("k", 1<<20)}
	seen := map[string]string{}
	for _, k := range keys {
		pre, post := keyForm(k)
		form := pre + k + post
		if other, dup := seen[form]; dup {
			t.Errorf("keys %q and %q share the name %q", k, other, form)
		}
		seen[form] = k
		if hashTag("rl:x:state:"+form) == "" {
			t.Errorf("key %q: name %.40q has no hash tag", k, form)
		}
	}
}

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
	d, err := decode([]any{int64(1), int64(4), int64(0), int64(1500), int64(250)}, 5)
	want := ratelimit.Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 1500 * time.Microsecond, Delay: 250 * time.Microsecond}
	if err != nil || d != want {
		t.Errorf("decode = %+v, %v; want %+v", d, err, want)
	}
	for _, bad := range []any{
		nil, "OK", int64(1), []any{},
		[]any{int64(1), int64(4), int64(0), int64(0)},
		[]any{int64(1), int64(4), int64(0), int64(0), int64(0), int64(0)},
		[]any{"1", int64(4), int64(0), int64(0), int64(0)},
		[]any{int64(2), int64(4), int64(0), int64(0), int64(0)},
		[]any{int64(0), int64(-1), int64(0), int64(0), int64(0)},
		[]any{int64(0), int64(4), int64(-5), int64(0), int64(0)},
		[]any{int64(0), int64(4), 1.5, int64(0), int64(0)},
	} {
		if _, err := decode(bad, 5); !errors.Is(err, ErrUnexpectedReply) {
			t.Errorf("decode(%#v) = %v; want ErrUnexpectedReply", bad, err)
		}
	}
}

func TestUnavailable(t *testing.T) {
	for _, err := range []error{
		context.DeadlineExceeded, io.EOF, io.ErrUnexpectedEOF, redis.ErrClosed, redis.ErrPoolTimeout,
		&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, fmt.Errorf("read: %w", syscall.ECONNRESET),
	} {
		if !unavailable(err) {
			t.Errorf("unavailable(%v) = false", err)
		}
	}
	for _, err := range []error{
		context.Canceled, fmt.Errorf("wrapped: %w", context.Canceled), redis.ErrNoScript,
		errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"),
	} {
		if unavailable(err) {
			t.Errorf("unavailable(%v) = true", err)
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
