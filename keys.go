package ratelimit

import "strings"

var keyEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

// Key joins parts into one limiter key. Different lists of parts never make the same
// key, but for Key() and Key(""), which are both empty. So callers pass a fixed number of
// parts. Each part is escaped, and the parts are joined with ":". The escapes are "%25"
// for "%", "%3A" for ":", "%7B" for "{" and "%7D" for "}". Key("a:b", "c") is "a%3Ab:c",
// and Key("a", "b:c") is "a:b%3Ac".
//
// No part can open a Redis hash tag. So keys built from untrusted input, such as a tenant
// name or a path, cannot choose their Redis Cluster slot. For keys that share a slot on
// purpose, see redisstore.TaggedKey.
func Key(parts ...string) string {
	escaped := make([]string, len(parts))
	for i, p := range parts {
		escaped[i] = keyEscaper.Replace(p)
	}
	return strings.Join(escaped, ":")
}
