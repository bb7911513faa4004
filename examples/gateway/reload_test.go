package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// syncBuffer is a log sink that tests can read while the watcher writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// eventually polls cond until it holds, or fails the test after 10 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

func rulesWith(capacity string) string {
	return "default: {capacity: 20, refill_per_second: 10}\nroutes: [{id: create-order, method: POST, prefix: /orders}]\n" +
		"rules: [{tenant_id: shop-a, route_id: create-order, capacity: " + capacity + ", refill_per_second: 1}]\n"
}

// rulesFile writes a rules file, and returns its path and a manager of its rules whose
// log goes to logs.
func rulesFile(t *testing.T, logs *syncBuffer) (string, *ruleManager) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rulesWith("2")), 0o644); err != nil {
		t.Fatal(err)
	}
	initial, err := loadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, newRuleManager(initial, slog.New(slog.NewTextHandler(logs, nil)))
}

func TestFileReload(t *testing.T) {
	var logs syncBuffer
	path, m := rulesFile(t, &logs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchFile(ctx, path, 10*time.Millisecond, time.Hour, m)
	capacity := func() int64 { return m.current.Load().policy("shop-a", "create-order").capacity }

	os.WriteFile(path, []byte(rulesWith("5")+"# changed\n"), 0o644)
	eventually(t, "the changed rule", func() bool { return capacity() == 5 })

	os.WriteFile(path, []byte(strings.Replace(rulesWith("7"), "capacity: 7", "capacity: -7", 1)), 0o644)
	eventually(t, "the error in the log", func() bool { return strings.Contains(logs.String(), "bad rules file") })
	if capacity() != 5 {
		t.Errorf("a broken file changed the rules: capacity %d", capacity())
	}
}

// TestFileGoneLogsOnce: a deleted rules file is logged once, not at every check; once it
// is back and gone again, once more.
func TestFileGoneLogsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncBuffer
		path, m := rulesFile(t, &logs)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go watchFile(ctx, path, time.Second, time.Hour, m)
		gone := func() int { return strings.Count(logs.String(), "cannot read the rules file") }

		os.Remove(path)
		time.Sleep(time.Minute) // 60 checks, on the bubble's clock
		if gone() != 1 {
			t.Fatalf("a deleted file logged %d times in 60 checks; want once", gone())
		}
		os.WriteFile(path, []byte(rulesWith("3")), 0o644)
		time.Sleep(2 * time.Second)
		if c := m.current.Load().policy("shop-a", "create-order").capacity; c != 3 {
			t.Fatalf("the file back: capacity %d; want 3", c)
		}
		os.Remove(path)
		time.Sleep(time.Minute)
		if gone() != 2 {
			t.Errorf("deleted again: logged %d times in all; want 2", gone())
		}
	})
}
