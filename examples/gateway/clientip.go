package main

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientIP finds a request's client behind trusted proxies. The peer (RemoteAddr) is the
// client, unless it is a trusted proxy: then X-Forwarded-For is read from the right, past
// the trusted hops, and the first address that is not trusted is the client. A header
// the client wrote itself sits to the left of that and is never read. IPv6 clients are
// masked to their /64, which one client usually holds whole.
func clientIP(trusted []netip.Prefix) func(*http.Request) (netip.Addr, bool) {
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (netip.Addr, bool) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		client, err := netip.ParseAddr(host)
		if err != nil {
			return netip.Addr{}, false
		}
		client = client.Unmap()
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0 && isTrusted(client); i-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // a malformed hop: the last trusted proxy is the best we know
			}
			client = hop.Unmap()
		}
		if client.Is6() {
			client = netip.PrefixFrom(client, 64).Masked().Addr()
		}
		return client, true
	}
}
