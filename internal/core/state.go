package core

import (
	"encoding/binary"
	"errors"

	"github.com/ratelimit-go/ratelimit/internal/eventlog"
)

// stateFormat is the first byte of a marshalled State: the version of the format, so that
// a later one can be told apart.
const stateFormat = 1

// maxStateEvents bounds the events UnmarshalBinary accepts, so that a corrupt length
// cannot ask for memory the data does not hold: a log holds at most a rule's Limit
// events, and a Limit is at most 2^52, but a state of more than this many would not fit
// the size of any store's value.
const maxStateEvents = 1 << 28

// MarshalBinary encodes the state in a few bytes: a version, Time, Level and Aux, then the
// events of Log in order (encoding.BinaryMarshaler). It never fails. An empty Log comes
// back from UnmarshalBinary as nil, which every algorithm reads as empty.
func (s State) MarshalBinary() ([]byte, error) {
	n := 0
	if s.Log != nil {
		n = s.Log.Len()
	}
	b := make([]byte, 0, 32+8*n)
	b = append(b, stateFormat)
	b = binary.AppendVarint(b, s.Time)
	b = binary.AppendVarint(b, s.Level)
	b = binary.AppendVarint(b, s.Aux)
	b = binary.AppendUvarint(b, uint64(n))
	for i := range n {
		e := s.Log.At(i)
		b = binary.AppendVarint(b, e.At)
		b = binary.AppendVarint(b, e.N)
	}
	return b, nil
}

// UnmarshalBinary sets the state to the one data encodes, as MarshalBinary made it
// (encoding.BinaryUnmarshaler). Data of another form is an error, and leaves the state as
// it was.
func (s *State) UnmarshalBinary(data []byte) error {
	bad := func(what string) error { return errors.New("ratelimit: State.UnmarshalBinary: " + what) }
	if len(data) == 0 || data[0] != stateFormat {
		return bad("not a state of this format")
	}
	rest := data[1:]
	next := func() (int64, bool) {
		v, k := binary.Varint(rest)
		if k <= 0 {
			return 0, false
		}
		rest = rest[k:]
		return v, true
	}
	var st State
	var ok [3]bool
	st.Time, ok[0] = next()
	st.Level, ok[1] = next()
	st.Aux, ok[2] = next()
	if ok != [3]bool{true, true, true} {
		return bad("truncated")
	}
	n, k := binary.Uvarint(rest)
	if k <= 0 {
		return bad("truncated")
	}
	rest = rest[k:]
	if n > maxStateEvents || n > uint64(len(rest))/2 { // each event takes two bytes at least
		return bad("more events than the data holds")
	}
	if n > 0 {
		st.Log = &eventlog.Log{}
		for range n {
			at, ok1 := next()
			count, ok2 := next()
			if !ok1 || !ok2 {
				return bad("truncated")
			}
			st.Log.Append(eventlog.Event{At: at, N: count})
		}
	}
	if len(rest) != 0 {
		return bad("trailing bytes")
	}
	*s = st
	return nil
}
