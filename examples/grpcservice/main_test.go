package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-go/ratelimit"
)

// start runs the service on free loopback ports, and returns its gRPC client and its
// metrics' URL.
func start(t *testing.T, c config) (testpb.TestServiceClient, string) {
	t.Helper()
	c.addr, c.httpAddr = "127.0.0.1:0", "127.0.0.1:0"
	// the embedded miniredis decides every call: a decision that a loaded machine delays
	// past the default budget would go to the fallback's share and fail open, and the
	// counts asserted here would not be the store's
	c.store.Timeout = 10 * time.Second
	if c.lease == 0 {
		c.lease = 30 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, c, slog.New(slog.NewTextHandler(io.Discard, nil)), func(g, h string) { addrs <- [2]string{g, h} })
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	conn, err := grpc.NewClient(a[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return testpb.NewTestServiceClient(conn), "http://" + a[1] + "/metrics"
}

func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
}

func call(c testpb.TestServiceClient, ctx context.Context, body string) error {
	_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 3, Payload: &testpb.Payload{Body: []byte(body)}})
	return err
}

// The rate limit: a key's calls past its rule are ResourceExhausted with the time to
// retry in RetryInfo and the grpc-retry-pushback-ms trailer; other keys are apart; a call
// without a key is Unauthenticated, and counts nowhere.
func TestRateLimit(t *testing.T) {
	client, metrics := start(t, config{rate: ratelimit.PerMinute(3), inflight: 5})
	for i := range 3 {
		if err := call(client, withKey("a"), ""); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	var trailer metadata.MD
	_, err := client.UnaryCall(withKey("a"), &testpb.SimpleRequest{}, grpc.Trailer(&trailer))
	if s := status.Convert(err); s.Code() != codes.ResourceExhausted || !strings.Contains(s.Message(), "rate limit exceeded; retry after 20s") {
		t.Fatalf("the fourth call: %v", err)
	}
	// 3 a minute: the next call in 20s, less the time the three calls took
	if got := retryDelay(err); got <= 19*time.Second || got > 20*time.Second ||
		len(trailer.Get("grpc-retry-pushback-ms")) != 1 || trailer.Get("grpc-retry-pushback-ms")[0] != strconv.FormatInt(got.Milliseconds(), 10) {
		t.Errorf("the fourth call: RetryInfo %v, trailer %v; want about 20s in both", got, trailer)
	}
	stream, err := client.StreamingOutputCall(withKey("a"), &testpb.StreamingOutputCallRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a stream of a key past its rate: %v", err)
	}
	if err := call(client, withKey("b"), ""); err != nil {
		t.Errorf("another key: %v", err)
	}
	if err := call(client, context.Background(), ""); status.Code(err) != codes.Unauthenticated || retryDelay(err) != 0 {
		t.Errorf("no key: %v; want Unauthenticated, with no retry delay", err)
	}
	body := get(t, metrics)
	for _, want := range []string{
		`ratelimit_decisions_total{outcome="allowed",policy="calls",source="primary"} 4`,
		`ratelimit_decisions_total{outcome="denied",policy="calls",source="primary"} 2`,
		`ratelimit_decisions_total{outcome="allowed",policy="in-flight",source="primary"} 4`,
		`ratelimit_decision_duration_seconds_count{policy="calls"} 6`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The in-flight limit, for unary and streaming calls alike: a key with two calls in
// progress is refused a third until one ends, whatever the rate allows.
func TestInFlight(t *testing.T) {
	release, entered := make(chan struct{}), make(chan struct{})
	client, _ := start(t, config{rate: ratelimit.PerSecond(1000), inflight: 2, release: release, entered: entered})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() { errs <- call(client, withKey("c"), "hold") })
	wg.Go(func() {
		stream, err := client.StreamingOutputCall(withKey("c"), &testpb.StreamingOutputCallRequest{
			Payload: &testpb.Payload{Body: []byte("hold")}, ResponseParameters: []*testpb.ResponseParameters{{Size: 2}}})
		if err == nil {
			_, err = stream.Recv()
		}
		errs <- err
	})
	refused := func(key string) bool {
		var trailer metadata.MD
		_, err := client.UnaryCall(withKey(key), &testpb.SimpleRequest{ResponseSize: 3}, grpc.Trailer(&trailer))
		s := status.Convert(err)
		return s.Code() == codes.ResourceExhausted && strings.Contains(s.Message(), "2 calls of this key are in progress") &&
			retryDelay(err) == time.Second && len(trailer.Get("grpc-retry-pushback-ms")) == 1 && trailer.Get("grpc-retry-pushback-ms")[0] == "1000"
	}
	<-entered // both held calls are in their handlers, each holding a lease
	<-entered
	if !refused("c") {
		t.Fatal("a third call of a key with two in progress was not refused")
	}
	if err := call(client, withKey("d"), ""); err != nil {
		t.Errorf("another key while c is full: %v", err)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a held call: %v", err)
		}
	}
	if refused("c") {
		t.Error("after the held calls ended, a call of c was still refused")
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestResponseSizeBounded: a call may not ask for a response of more than 64 KiB: one of
// 256 MiB (the field allows 2 GiB) is InvalidArgument, and allocates nothing like it.
func TestResponseSizeBounded(t *testing.T) {
	client, _ := start(t, config{rate: ratelimit.PerMinute(100), inflight: 5})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := client.UnaryCall(withKey("a"), &testpb.SimpleRequest{ResponseSize: 256 << 20})
	runtime.ReadMemStats(&after)
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a response of 256 MiB: %v; want InvalidArgument", err)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20 {
		t.Errorf("the call allocated %d MiB", grown>>20)
	}
	if _, err := client.UnaryCall(withKey("a"), &testpb.SimpleRequest{ResponseSize: 64 << 10}); err != nil {
		t.Errorf("a response of 64 KiB: %v", err)
	}
}

// retryDelay is the google.rpc.RetryInfo in err's status details, or 0.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}
