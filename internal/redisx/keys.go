// Package redisx is what the Redis packages of this module share: the one home of the
// names of the Redis keys they write (this file: the prefix's form, a namespace's and a
// limiter key's, so that every key of one limiter key sits in one Redis Cluster hash
// slot and no two keys share a name; see the redisstore package doc, "Keys"), and what
// an error of go-redis means (errors.go). The value a key holds is the scripts' ("T:L:A",
// see internal/core's helpers.lua).
package redisx

import (
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
