package redistest

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections on loopback to a server, as a network between them
// would: every reply reaches the client the delay later than the server sent it (the
// added round trip), give or take the jitter, in order on its connection however many
// are on the way; the next HoldNext replies, and every HoldEvery'th, are held
// longer still, past a client's read timeout or its caller's deadline. A sleeping
// goroutine wakes a little late, more on a busy machine, and the proxy does not make up
// for it: a reply is as late as the machine makes it, as on a real network host. It
// counts the connections it accepts, which are the connections the server accepts
// through it.
type Proxy struct {
	Addr         string
	accepted     atomic.Int64
	delay        atomic.Int64 // time.Duration
	jitter       atomic.Int64 // time.Duration: each reply's delay is uniform in delay +- jitter
	hold         atomic.Int64 // time.Duration
	holdNext     atomic.Int64
	holdEvery    atomic.Int64 // hold each reply whose count is a multiple of it; 0: none
	holdEveryFor atomic.Int64 // time.Duration
	replied      atomic.Int64 // the replies read from the server, counted for holdEvery
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

// SetJitter makes each reply's delay from now on uniform between the delay less j and
// the delay plus j (never below 0); replies on one connection still arrive in order.
func (p *Proxy) SetJitter(j time.Duration) { p.jitter.Store(int64(j)) }

// HoldEvery holds every nth reply from now on (the nth, the 2nth, ...) d longer than its
// delay; the replies behind one on its connection wait for it. The held replies are
// counted, not drawn at random, so that a run of a given number of replies holds the
// same number whatever the luck: a test's share of held decisions is then a fixed
// number, not a draw that fails one run in a few.
func (p *Proxy) HoldEvery(n int64, d time.Duration) {
	p.holdEveryFor.Store(int64(d))
	p.replied.Store(0)
	p.holdEvery.Store(n)
}

// HoldNext holds each of the next n replies d longer than the delay.
func (p *Proxy) HoldNext(n int64, d time.Duration) {
	p.hold.Store(int64(d))
	p.holdNext.Store(n)
}

// Held is how many of the replies HoldNext asked for are still to come.
func (p *Proxy) Held() int64 { return max(0, p.holdNext.Load()) }

// Accepted is how many connections the proxy has accepted.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// replyDelay is how long a reply read now takes to reach its client.
func (p *Proxy) replyDelay() time.Duration {
	d := time.Duration(p.delay.Load())
	if j := p.jitter.Load(); j > 0 {
		d = max(0, d+time.Duration(rand.Int64N(2*j+1)-j))
	}
	if p.holdNext.Add(-1) >= 0 {
		d += time.Duration(p.hold.Load())
	}
	if every := p.holdEvery.Load(); every > 0 && p.replied.Add(1)%every == 0 {
		d += time.Duration(p.holdEveryFor.Load())
	}
	return d
}

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
				at := time.Now().Add(p.replyDelay())
				queue <- chunk{buf[:n], at}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		if wait := time.Until(c.at); wait > 0 {
			time.Sleep(wait) // the network under test: the reply is on its way
		}
		if _, err := client.Write(c.data); err != nil {
			server.Close()
			for range queue { // let the reader end
			}
			return
		}
	}
}
