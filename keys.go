package ratelimit

import "strings"

var keyEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

// Key joins parts into one limiter key so that different lists of parts never make the
// same key (but for Key() and Key(""), both empty: callers pass a fixed number of parts):
// each part is escaped ("%", ":", "{" and "}" become "%25", "%3A", "%7B" and
// "%7D") and the parts are joined with ":". Key("a:b", "c") is "a%3Ab:c" and Key("a",
// "b:c") is "a:b%3Ac". No part can open a Redis hash tag, so keys built from untrusted
// input (a tenant name, a path) cannot choose their Redis Cluster slot (see
// redisstore.TaggedKey for keys that share one on purpose).
func Key(parts ...string) string {
	escaped := make([]string, len(parts))
	for i, p := range parts {
		escaped[i] = keyEscaper.Replace(p)
	}
	return strings.Join(escaped, ":")
}
