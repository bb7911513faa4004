package mathx

import (
	"math"
	"math/big"
	"testing"
	"time"
)

func TestDivisions(t *testing.T) {
	for _, tc := range []struct{ a, b, ceil, floor int64 }{
		{0, 1, 0, 0}, {7, 1, 7, 7}, {7, 2, 4, 3}, {8, 2, 4, 4}, {1, 1000, 1, 0},
		{MaxExact, 3, (MaxExact + 2) / 3, MaxExact / 3},
		{-7, 2, 0, -4}, {-8, 2, 0, -4}, {-1, 1000, 0, -1},
	} {
		if tc.a >= 0 {
			if got := CeilDiv(tc.a, tc.b); got != tc.ceil {
				t.Errorf("CeilDiv(%d, %d) = %d; want %d", tc.a, tc.b, got, tc.ceil)
			}
		}
		if got := FloorDiv(tc.a, tc.b); got != tc.floor {
			t.Errorf("FloorDiv(%d, %d) = %d; want %d", tc.a, tc.b, got, tc.floor)
		}
	}
}

// AddCapped never overflows, however large dt*rate is.
func TestAddCapped(t *testing.T) {
	for _, tc := range []struct{ x, dt, rate, limit, want int64 }{
		{0, 0, 5, 10, 0}, {3, 1, 5, 10, 8}, {3, 2, 5, 10, 10}, {10, 1, 1, 10, 10},
		{0, math.MaxInt64, math.MaxInt64, MaxExact, MaxExact},
		{1, 1 << 40, 1 << 40, 1 << 50, 1 << 50},
	} {
		if got := AddCapped(tc.x, tc.dt, tc.rate, tc.limit); got != tc.want {
			t.Errorf("AddCapped(%d, %d, %d, %d) = %d; want %d", tc.x, tc.dt, tc.rate, tc.limit, got, tc.want)
		}
	}
}

// MulDiv is exact where x*part overflows 64 bits.
func TestMulDiv(t *testing.T) {
	for _, tc := range []struct{ x, part, whole int64 }{
		{10, 1, 3}, {100, 30, 100}, {MaxExact, 999, 1000}, {math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64},
	} {
		want := new(big.Int).Mul(big.NewInt(tc.x), big.NewInt(tc.part))
		want.Quo(want, big.NewInt(tc.whole))
		if got := MulDiv(tc.x, tc.part, tc.whole); got != want.Int64() {
			t.Errorf("MulDiv(%d, %d, %d) = %d; want %d", tc.x, tc.part, tc.whole, got, want.Int64())
		}
	}
}

func TestGcd(t *testing.T) {
	for _, tc := range []struct{ a, b, want int64 }{{1000000, 100, 100}, {7, 3, 1}, {12, 18, 6}, {5, 5, 5}} {
		if got := Gcd(tc.a, tc.b); got != tc.want {
			t.Errorf("Gcd(%d, %d) = %d; want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// Keep is reserve% of limit rounded down, exactly, for every limit a rule may have.
func TestKeep(t *testing.T) {
	for _, tc := range []struct{ limit, reserve, want int64 }{
		{100, 0, 0}, {100, 20, 20}, {100, 50, 50}, {7, 50, 3}, {1, 99, 0}, {199, 99, 197}, {100, -5, 0},
		{MaxExact, 99, 4458563631096791}, // floor(2^52 * 99 / 100)
	} {
		if got := Keep(tc.limit, tc.reserve); got != tc.want {
			t.Errorf("Keep(%d, %d) = %d; want %d", tc.limit, tc.reserve, got, tc.want)
		}
	}
}

func TestCheckRule(t *testing.T) {
	ok := []struct {
		limit  int64
		period time.Duration
		burst  int64
	}{{1, MinPeriod, 0}, {MaxExact, MaxPeriod, MaxExact}, {100, time.Second, 200}}
	for _, r := range ok {
		if err := CheckRule(r.limit, r.period, r.burst); err != nil {
			t.Errorf("CheckRule(%d, %v, %d): %v", r.limit, r.period, r.burst, err)
		}
	}
	bad := []struct {
		limit  int64
		period time.Duration
		burst  int64
	}{{0, time.Second, 0}, {MaxExact + 1, time.Second, 0}, {1, MinPeriod - 1, 0}, {1, MaxPeriod + 1, 0},
		{1, time.Second + time.Nanosecond, 0}, {1, time.Second, -1}, {1, time.Second, MaxExact + 1}}
	for _, r := range bad {
		if err := CheckRule(r.limit, r.period, r.burst); err == nil {
			t.Errorf("CheckRule(%d, %v, %d): no error", r.limit, r.period, r.burst)
		}
	}
}

func TestMicros(t *testing.T) {
	if got := Micros(1500); got != 1500*time.Microsecond {
		t.Errorf("Micros(1500) = %v", got)
	}
}
