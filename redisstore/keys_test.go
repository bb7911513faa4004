package redisstore_test

import (
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

func TestTaggedKeyNeverCollides(t *testing.T) {
	lists := [][]string{
		{"a:b", "c"}, {"a", "b:c"}, {"a", "b", "c"}, {"a:b:c"}, {""}, {"", ""}, {":"}, {"%3A"},
		{"{a}", "b"}, {"a}", "{b"}, {"a%", "b"}, {"a", "%b"}, {"a%3Ab"},
	}
	seen := map[string][]string{}
	for _, parts := range lists {
		for _, k := range []string{ratelimit.Key(parts...), redisstore.TaggedKey("t", parts...), redisstore.TaggedKey("t:x", parts...)} {
			if other, dup := seen[k]; dup {
				t.Errorf("%q and %q both make the key %q", parts, other, k)
			}
			seen[k] = parts
		}
	}
}

func TestTaggedKeyHasOneTag(t *testing.T) {
	for _, tag := range []string{"shop-a", "}", "{x}", "a}b{", ""} {
		k := redisstore.TaggedKey(tag, "route}", "{x")
		open, end := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
		if open != 0 || k[open+1:end] != strings.NewReplacer("{", "%7B", "}", "%7D").Replace(tag) {
			t.Errorf("TaggedKey(%q) = %q: the tag is not the escaped tenant", tag, k)
		}
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("TaggedKey(%q) = %q: user braces survived", tag, k)
		}
	}
}
