package main

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed schema.sql
var schema string

// postgres returns the DSN of a fresh schema on a PostgreSQL server, dropped after the
// test: RATELIMIT_POSTGRES_DSN, or the local server. Without one the test is skipped, or
// fails when RATELIMIT_REQUIRE_POSTGRES=1.
func postgres(t *testing.T) (dsn string, conn *pgx.Conn) {
	t.Helper()
	base := os.Getenv("RATELIMIT_POSTGRES_DSN")
	if base == "" {
		base = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		if os.Getenv("RATELIMIT_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("no PostgreSQL at %s, and RATELIMIT_REQUIRE_POSTGRES=1: %v", base, err)
		}
		t.Skipf("no PostgreSQL at %s (set RATELIMIT_POSTGRES_DSN): %v", base, err)
	}
	name := fmt.Sprintf("gateway_test_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE")
		admin.Close(context.Background())
	})
	dsn = base + "&search_path=" + name
	conn, err = pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, schema); err != nil {
		t.Fatal(err)
	}
	return dsn, conn
}

func testPostgresReload(t *testing.T, every time.Duration, withTrigger bool) {
	dsn, conn := postgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if !withTrigger {
		if _, err := conn.Exec(ctx, "DROP TRIGGER rate_limit_rule_changed ON rate_limit_rule"); err != nil {
			t.Fatal(err)
		}
	}
	initial, err := parseRules([]byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	m := newRuleManager(initial, slog.New(slog.NewTextHandler(&logs, nil)))
	go watchPostgres(ctx, dsn, every, m)
	capacity := func() int64 { return m.current.Load().policy("shop-c", "create-order").capacity }
	// the table is empty, so the file's shop-a rule goes: shop-a gets the default
	eventually(t, "the database's (empty) rules", func() bool {
		return m.current.Load().policy("shop-a", "create-order").capacity == 20
	})

	if _, err := conn.Exec(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second, in_flight) VALUES ('shop-c', 'create-order', 3, 1, 7)`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the inserted rule", func() bool { return capacity() == 3 })
	if p := m.current.Load().policy("shop-c", "create-order"); p.inFlight != 7 {
		t.Errorf("in_flight of the inserted rule: %d; want 7", p.inFlight)
	}
	if _, err := conn.Exec(ctx, `UPDATE rate_limit_rule SET capacity = 9, quota = '500 per day in Europe/Madrid', updated_at = now() WHERE tenant_id = 'shop-c'`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the updated rule", func() bool { return capacity() == 9 })
	if q := m.current.Load().policy("shop-c", "create-order").quota; q == nil || q.String() != "500 per day in Europe/Madrid" {
		t.Errorf("the updated rule's quota: %v; want 500 per day in Europe/Madrid", q)
	}
	// a row for an unknown route is rejected, the rules in force stay
	if _, err := conn.Exec(ctx, `INSERT INTO rate_limit_rule (tenant_id, route_id, capacity, refill_per_second) VALUES ('shop-d', 'no-such-route', 3, 1)`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bad row's rejection", func() bool { return strings.Contains(logs.String(), "bad rules in the database") })
	if capacity() != 9 {
		t.Errorf("a bad row changed the rules: capacity %d", capacity())
	}
	if _, err := conn.Exec(ctx, `DELETE FROM rate_limit_rule WHERE tenant_id = 'shop-d'; UPDATE rate_limit_rule SET capacity = 4 WHERE tenant_id = 'shop-c'`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rule after the bad row went", func() bool { return capacity() == 4 })
}

// TestPostgresNotify: with the trigger, a change applies at once (the poll is an hour).
func TestPostgresNotify(t *testing.T) { testPostgresReload(t, time.Hour, true) }

// TestPostgresPoll: without the trigger, a change applies within the reload interval.
func TestPostgresPoll(t *testing.T) { testPostgresReload(t, 100*time.Millisecond, false) }
