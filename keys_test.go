package ratelimit_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit"
)

func TestKeyNeverCollides(t *testing.T) {
	lists := [][]string{
		{"a:b", "c"}, {"a", "b:c"}, {"a", "b", "c"}, {"a:b:c"}, {""}, {"", ""}, {":"}, {"%3A"},
		{"{a}", "b"}, {"a}", "{b"}, {"a%", "b"}, {"a", "%b"}, {"a%3Ab"},
	}
	seen := map[string][]string{}
	for _, parts := range lists {
		k := ratelimit.Key(parts...)
		if other, dup := seen[k]; dup {
			t.Errorf("%q and %q both make the key %q", parts, other, k)
		}
		seen[k] = parts
	}
	if k := ratelimit.Key("a:b", "c"); k != "a%3Ab:c" {
		t.Errorf("Key = %q", k)
	}
}
