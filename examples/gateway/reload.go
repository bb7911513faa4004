package main

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// ruleManager holds the rules in force: the routes and default of the rules file (or the
// embedded one), with the file's rules, or the database's rows when there is a database.
// A load that fails keeps the last good rules, and says why in the log.
type ruleManager struct {
	mu      sync.Mutex
	file    *Rules
	rows    []spec // nil without a database
	current atomic.Pointer[Rules]
	log     *slog.Logger
}

func newRuleManager(initial *Rules, log *slog.Logger) *ruleManager {
	m := &ruleManager{file: initial, log: log}
	m.current.Store(initial)
	return m
}

func (m *ruleManager) setFile(r *Rules) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rows != nil {
		merged, err := r.withRows(m.rows)
		if err != nil {
			m.log.Error("the new rules file does not fit the database's rules; keeping the old rules", "err", err)
			return
		}
		r = merged
	}
	m.file = r
	m.current.Store(r)
	m.log.Info("rules loaded", "source", "file", "routes", len(r.routes), "rules", len(r.rules))
}

// setRows makes rows the rules in force, and reports whether they were good.
func (m *ruleManager) setRows(rows []spec) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.file.withRows(rows)
	if err != nil {
		m.log.Error("bad rules in the database; keeping the old rules", "err", err)
		return false
	}
	m.rows = rows
	m.current.Store(r)
	m.log.Info("rules loaded", "source", "database", "rules", len(r.rules))
	return true
}

// watchFile reloads path when it changes (checked every check) and every every. A
// problem (the file gone, or broken) is logged once, and again only when it changes.
func watchFile(ctx context.Context, path string, check, every time.Duration, m *ruleManager) {
	var lastMod time.Time
	var lastSize int64
	var lastLoad time.Time
	var problem string // the last one logged; empty once the file loads again
	report := func(msg string, err error) {
		if p := msg + ": " + err.Error(); p != problem {
			problem = p
			m.log.Error(msg+"; keeping the old rules", "path", path, "err", err)
		}
	}
	t := time.NewTicker(check)
	defer t.Stop()
	for {
		info, err := os.Stat(path)
		switch {
		case err != nil:
			report("cannot read the rules file", err)
			lastMod, lastSize = time.Time{}, -1 // read it again as soon as it is back
		case !info.ModTime().Equal(lastMod) || info.Size() != lastSize || time.Since(lastLoad) >= every:
			lastMod, lastSize, lastLoad = info.ModTime(), info.Size(), time.Now()
			data, err := os.ReadFile(path)
			if err == nil {
				var r *Rules
				if r, err = parseRules(data); err == nil {
					m.setFile(r)
					problem = ""
				}
			}
			if err != nil {
				report("bad rules file", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchPostgres reads the rate_limit_rule table every every, and at once when it is told
// of a change (LISTEN rate_limit_rule_changed, see schema.sql). It keeps trying while the
// database is away; requests never wait for it.
func watchPostgres(ctx context.Context, dsn string, every time.Duration, m *ruleManager) {
	reload := make(chan struct{}, 1)
	poke := func() {
		select {
		case reload <- struct{}{}:
		default:
		}
	}
	go listen(ctx, dsn, poke, m.log)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if rows, err := readRules(ctx, dsn); err != nil {
			if ctx.Err() == nil {
				m.log.Error("cannot read rules from the database; keeping the old rules", "err", err)
			}
		} else {
			m.setRows(rows)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-reload:
		}
	}
}

func readRules(ctx context.Context, dsn string) ([]spec, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT tenant_id, route_id, capacity, refill_per_second, in_flight, quota FROM rate_limit_rule ORDER BY id`)
	if err != nil {
		return nil, err
	}
	specs := []spec{} // not nil: a database with no rules still replaces the file's rules
	for rows.Next() {
		var s spec
		var capacity, refill, inFlight int32
		if err := rows.Scan(&s.TenantID, &s.RouteID, &capacity, &refill, &inFlight, &s.Quota); err != nil {
			return nil, err
		}
		s.Capacity, s.RefillPerSecond, s.InFlight = count(capacity), count(refill), count(inFlight)
		specs = append(specs, s)
	}
	return specs, rows.Err()
}

// listen calls poke on every notification of a change, reconnecting while ctx lasts.
func listen(ctx context.Context, dsn string, poke func(), log *slog.Logger) {
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			if _, err = conn.Exec(ctx, "LISTEN rate_limit_rule_changed"); err == nil {
				poke() // catch what changed while we were not listening
				for err == nil {
					if _, err = conn.WaitForNotification(ctx); err == nil {
						poke()
					}
				}
			}
			conn.Close(context.Background())
		}
		if ctx.Err() == nil {
			log.Warn("not listening for rule changes; retrying in 5s (the table is still read every -reload)", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
}
