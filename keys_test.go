package ratelimit_test

import (
	"strings"
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
		for _, k := range []string{ratelimit.Key(parts...), ratelimit.TaggedKey("t", parts...), ratelimit.TaggedKey("t:x", parts...)} {
			if other, dup := seen[k]; dup {
				t.Errorf("%q and %q both make the key %q", parts, other, k)
			}
			seen[k] = parts
		}
	}
	if k := ratelimit.Key("a:b", "c"); k != "a%3Ab:c" {
		t.Errorf("Key = %q", k)
	}
}

func TestTaggedKeyHasOneTag(t *testing.T) {
	for _, tag := range []string{"shop-a", "}", "{x}", "a}b{", ""} {
		k := ratelimit.TaggedKey(tag, "route}", "{x")
		open, end := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
		if open != 0 || k[open+1:end] != strings.NewReplacer("{", "%7B", "}", "%7D").Replace(tag) {
			t.Errorf("TaggedKey(%q) = %q: the tag is not the escaped tenant", tag, k)
		}
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("TaggedKey(%q) = %q: user braces survived", tag, k)
		}
	}
}
