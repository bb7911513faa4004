package main

import (
	"net/http/httptest"
	"net/netip"
	"testing"
)

func TestClientIP(t *testing.T) {
	ip := clientIP([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")})
	for _, tc := range []struct{ remote, xff, want string }{
		{"198.51.100.9:1234", "", "198.51.100.9"},
		{"198.51.100.9:1234", "1.2.3.4", "198.51.100.9"},                    // an untrusted peer's header is ignored
		{"10.0.0.1:1234", "203.0.113.7", "203.0.113.7"},                     // one trusted proxy
		{"10.0.0.1:1234", "1.2.3.4, 203.0.113.7, 10.0.0.2", "203.0.113.7"},  // past two trusted hops; 1.2.3.4 is the client's own claim
		{"10.0.0.1:1234", "10.0.0.3, 10.0.0.2", "10.0.0.3"},                 // all trusted: the farthest
		{"10.0.0.1:1234", "garbage, 203.0.113.7", "203.0.113.7"},            // a malformed hop past the client is never read
		{"10.0.0.1:1234", "203.0.113.7, garbage", "10.0.0.1"},               // a malformed hop: stop at the last trusted
		{"[2001:db8:1:2:3:4:5:6]:443", "", "2001:db8:1:2::"},                // IPv6 masked to /64
		{"[fd00::1]:443", "2001:db8:aa:bb:cc:dd:ee:ff", "2001:db8:aa:bb::"}, // behind a trusted IPv6 proxy
		{"[::ffff:10.0.0.1]:80", "203.0.113.7", "203.0.113.7"},              // IPv4-mapped peer
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		got, ok := ip(r)
		if !ok || got.String() != tc.want {
			t.Errorf("%s with X-Forwarded-For %q: %v, %v; want %s", tc.remote, tc.xff, got, ok, tc.want)
		}
	}
}
