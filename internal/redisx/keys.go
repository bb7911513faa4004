// Package redisx is what the Redis packages of this module share: the one home of the
// names of the Redis keys they write (this file: a limiter key's parts, so that every
// part of one limiter key sits in one Redis Cluster hash slot and no two keys share a
// name, and the keys of regions and members; see the redisstore package doc, "Keys"), and
// what an error of go-redis means (errors.go). The value a key holds is the scripts' (see
// internal/script).
package redisx

import (
	"strconv"
	"strings"

	"github.com/ratelimit-go/ratelimit"
)

// DefaultPrefix starts every key's name unless an option says otherwise.
const DefaultPrefix = "rl"

// Prefix is prefix as it starts key names: its braces replaced with parentheses, since
// braces would pin every key to one hash slot.
func Prefix(prefix string) string { return prefixEscaper.Replace(prefix) }

var prefixEscaper = strings.NewReplacer("{", "(", "}", ")")

// Namespace is a namespace as it stands in key names: escaped, and followed by a colon.
func Namespace(ns string) string { return Escape(ns) + ":" }

// Escape is s with "%", ":", "{" and "}" escaped as in a URL, so that it holds no colon
// or brace: it can stand between a key name's colons and steer no hash slot. It is
// ratelimit.Key's escaping of one part, the one home of it.
func Escape(s string) string { return ratelimit.Key(s) }

// Form is what goes before and after limiter key k at the end of each of its Redis keys'
// names: distinct for distinct keys, and with one hash tag for all the parts of a key.
// A key that carries a hash tag keeps it ("t:" + k); a key without braces is its own tag
// ("{" + k + "}"); any other (empty, stray braces) is tagged by its hash, so that no
// brace a user puts in a key can steer its slot.
func Form(k string) (pre, post string) {
	if open := strings.IndexByte(k, '{'); open >= 0 {
		if end := strings.IndexByte(k[open+1:], '}'); end > 0 {
			return "t:", ""
		}
	}
	if k != "" && !strings.ContainsAny(k, "{}") {
		return "{", "}"
	}
	return "{" + Hash(k) + "}:", ""
}

// Part is how the names of one part of an algorithm's keys start, under prefix (as
// Prefix makes it): "<prefix>:<algorithm>:<part>:".
func Part(prefix, algorithm, part string) string {
	return prefix + ":" + algorithm + ":" + part + ":"
}

// Loans is how the names of an algorithm's records of loans (core.Lender) start,
// under prefix: a part of its own beside the algorithm's keys, so that a key's record
// shares its hash slot.
func Loans(prefix, algorithm string) string { return Part(prefix, algorithm, "loans") }

// Key is a limiter key in a namespace as it ends the name of each of its parts: the
// namespace's form, then the key's (Form). The zero Key is the empty key of the empty
// namespace's form, which no name has: use NewKey.
type Key struct {
	ns, pre, key, post string
}

// NewKey is key in the namespace whose form is nsForm (Namespace's, which a caller may
// keep: it costs an allocation).
func NewKey(nsForm, key string) Key {
	pre, post := Form(key)
	return Key{nsForm, pre, key, post}
}

// Name is the Redis key of part (as Part makes it) of k.
func (k Key) Name(part string) string {
	var b strings.Builder
	b.Grow(k.Len(part))
	k.Write(&b, part)
	return b.String()
}

// Write writes Name(part) to b, and Len is its length: a batch writes the names of all
// its calls into one string.
func (k Key) Write(b *strings.Builder, part string) {
	b.WriteString(part)
	b.WriteString(k.ns)
	b.WriteString(k.pre)
	b.WriteString(k.key)
	b.WriteString(k.post)
}

// Len is the length of Name(part).
func (k Key) Len(part string) int {
	return len(part) + len(k.ns) + len(k.pre) + len(k.key) + len(k.post)
}

// Tagged is ratelimit.Key(parts...) under the Redis hash tag of tag (redisstore.TaggedKey).
func Tagged(tag string, parts ...string) string {
	return "{" + Escape(tag) + "}:" + ratelimit.Key(parts...)
}

// Shard is the limiter key of shard i of key (hotkey.Shard): a hash tag of its own (the
// key's digest and the shard), so that the key's form keeps it and a cluster spreads the
// shards; then the key itself, so that distinct keys stay distinct.
func Shard(key string, i uint64) string {
	return "{" + Hash(key) + "." + strconv.FormatUint(i, 10) + "}:" + key
}

// Members is the key of the sorted set of a group's members, under prefix.
func Members(prefix, group string) string {
	return prefix + ":members:{" + Escape(group) + "}"
}

// The keys of regions, under prefix, all on one hash tag each: the weights; the demand
// of a bucket of time, and whether a region has reported it; the lock of a rebalance.
func RegionsWeights(prefix string) string { return prefix + ":regions:{weights}" }

func RegionsDemand(prefix string, bucket int64) string {
	return prefix + ":regions:{demand}:" + strconv.FormatInt(bucket, 10)
}

func RegionsReported(prefix string, bucket int64) string {
	return prefix + ":regions:{demand}:reported:" + strconv.FormatInt(bucket, 10)
}

func RegionsLock(prefix string, bucket int64) string {
	return prefix + ":regions:{lock}:" + strconv.FormatInt(bucket, 10)
}

// HashTag is what Redis Cluster hashes of a key's name: the text between the first "{"
// and the first "}" after it, if not empty; else "" (the whole name).
func HashTag(name string) string {
	open := strings.IndexByte(name, '{')
	if open < 0 {
		return ""
	}
	end := strings.IndexByte(name[open+1:], '}')
	if end <= 0 {
		return ""
	}
	return name[open+1 : open+1+end]
}

// Hash is the 64-bit FNV-1a hash of s in 16 hex digits.
func Hash(s string) string {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[h&15]
		h >>= 4
	}
	return string(b[:])
}
