package localstore

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"unsafe"
)

// hasher hashes keys under four random 64-bit secrets, so that no one who has not read
// the process's memory can choose keys that collide in the store's tables. It is the
// multiply-and-fold of the wyhash family (the Go runtime's own hash of map keys where
// the processor has no AES), written out here because hash/maphash reaches the same
// kind of hash through three calls, a good part of an in-memory decision.
type hasher [4]uint64

func newHasher() hasher {
	return hasher{rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64()}
}

// sum is the hash of key.
func (h *hasher) sum(key string) uint64 {
	b := unsafe.Slice(unsafe.StringData(key), len(key))
	acc := h[0]
	for len(b) > 16 {
		acc = fold(binary.LittleEndian.Uint64(b)^h[1], binary.LittleEndian.Uint64(b[8:])^acc)
		b = b[16:]
	}
	var x, y uint64
	switch n := len(b); {
	case n >= 8:
		x, y = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[n-8:])
	case n >= 4:
		x, y = uint64(binary.LittleEndian.Uint32(b)), uint64(binary.LittleEndian.Uint32(b[n-4:]))
	case n > 0:
		x = uint64(b[0])<<16 | uint64(b[n>>1])<<8 | uint64(b[n-1])
	}
	return fold(h[2]^uint64(len(key)), fold(x^h[1], y^acc^h[3]))
}

// fold multiplies a and b into 128 bits and folds the halves together.
func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}
