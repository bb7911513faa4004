package ratelimit

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// ClientIP returns the address of the client that sent r. The peer (r.RemoteAddr) is the
// client, unless it is in one of the trusted prefixes. These are the proxies or load
// balancers in front of the server. From a trusted peer, X-Forwarded-For is read from the
// right, past the trusted hops. The first address that is not trusted is the client.
// Whatever the client wrote in the header itself sits to the left and is never read. A
// client therefore cannot choose its own address. With no trusted prefixes,
// X-Forwarded-For is ignored.
//
// An IPv6 client is masked to its /64, which one client usually holds whole. The error
// reports that RemoteAddr is not an IP address (a custom listener's, say).
func ClientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	client, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, errors.New("ratelimit: the request's RemoteAddr " + strconv.Quote(r.RemoteAddr) + " is not an IP address")
	}
	client = client.Unmap()
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	if isTrusted(client) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0 && isTrusted(client); i-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // a malformed hop: the last trusted proxy is the best we know
			}
			client = hop.Unmap()
		}
	}
	if client.Is6() {
		client = netip.PrefixFrom(client, 64).Masked().Addr()
	}
	return client, nil
}
