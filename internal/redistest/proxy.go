package redistest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections on loopback to a server, as a network between them
// would: every reply reaches the client Delay later than the server sent it (the added
// round trip), in order, however many are on the way; and the next HoldNext replies are
// held Hold longer, past a client's read timeout. It counts the connections it accepts,
// which are the connections the server accepts through it.
type Proxy struct {
	Addr     string
	accepted atomic.Int64
	delay    atomic.Int64 // time.Duration
	hold     atomic.Int64 // time.Duration
	holdNext atomic.Int64
	late     atomic.Int64 // how late a reply would be delivered, on average (see replies)
}

// StartProxy starts a Proxy to server on a free loopback port, closed with every
// connection through it when the test ends.
func StartProxy(t testing.TB, server string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: l.Addr().String()}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() { // close what the clients left open, and wait for the copies to end
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, s)
			mu.Unlock()
			conns.Add(2)
			go func() { defer conns.Done(); io.Copy(s, c); s.Close() }()
			go func() { defer conns.Done(); p.replies(s, c) }()
		}
	}()
	return p
}

// SetDelay makes every reply from now on reach its client d after the server sent it.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// HoldNext holds each of the next n replies d longer than the delay.
func (p *Proxy) HoldNext(n int64, d time.Duration) {
	p.hold.Store(int64(d))
	p.holdNext.Store(n)
}

// Held is how many of the replies HoldNext asked for are still to come.
func (p *Proxy) Held() int64 { return max(0, p.holdNext.Load()) }

// Accepted is how many connections the proxy has accepted.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

type chunk struct {
	data []byte
	at   time.Time // when it may reach the client
}

// replies copies what the server sends to the client, each read delivered at its time.
func (p *Proxy) replies(server, client net.Conn) {
	defer client.Close()
	queue := make(chan chunk, 1024)
	go func() {
		defer close(queue)
		for {
			buf := make([]byte, 64<<10)
			n, err := server.Read(buf)
			if n > 0 {
				at := time.Now().Add(time.Duration(p.delay.Load()))
				if p.holdNext.Add(-1) >= 0 {
					at = at.Add(time.Duration(p.hold.Load()))
				}
				queue <- chunk{buf[:n], at}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		// the network under test: the reply is on its way. A sleeping goroutine wakes a
		// little late (more on a busy machine); the proxy wakes that much earlier, so
		// that on average a reply arrives at its time.
		if wait := time.Until(c.at) - time.Duration(p.late.Load()); wait > 0 {
			time.Sleep(wait)
			late := int64(time.Since(c.at))
			for old := p.late.Load(); !p.late.CompareAndSwap(old, max(0, old+late/8)); old = p.late.Load() {
			}
		}
		if _, err := client.Write(c.data); err != nil {
			server.Close()
			for range queue { // let the reader end
			}
			return
		}
	}
}
