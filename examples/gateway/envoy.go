package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/internal/envoyrules"
)

// envoyKeys are the descriptor keys the gateway fills from a request, for rules in the
// format of Envoy's rate limit service (-envoy-rules).
var envoyKeys = map[string]func(r *http.Request, tenant, route string) string{
	"api_key": func(_ *http.Request, tenant, _ string) string { return tenant },
	"route":   func(_ *http.Request, _, route string) string { return route },
	"path":    func(r *http.Request, _, _ string) string { return r.URL.Path },
	"method":  func(r *http.Request, _, _ string) string { return r.Method },
}

// envoyRules decide the gateway's requests under rules in Envoy's rate limit service
// format: a request's descriptors are, for each chain of keys of the file's tree (a
// top-level key, and each nested key under it that has a rate limit), the request's
// values of those keys; all of them are decided at once, all or none.
type envoyRules struct {
	current atomic.Pointer[envoyDomain]
	decider envoyrules.Decider
}

type envoyDomain struct {
	domain *envoyrules.Domain
	chains [][]string
}

// newEnvoyRules loads the rules at path (one domain; every key the gateway can fill).
func newEnvoyRules(path string, store ratelimit.Store) (*envoyRules, error) {
	c, err := envoyrules.Load(path)
	if err != nil {
		return nil, err
	}
	e := &envoyRules{decider: envoyrules.Decider{Store: store}}
	if err := e.set(c); err != nil {
		return nil, err
	}
	return e, nil
}

// set makes c the rules in force, if the gateway can use them.
func (e *envoyRules) set(c *envoyrules.Config) error {
	names := c.Domains()
	if len(names) != 1 {
		return fmt.Errorf("the gateway reads one domain; these rules hold %d (%s)", len(names), strings.Join(names, ", "))
	}
	d := &envoyDomain{domain: c.Domain(names[0]), chains: c.Domain(names[0]).Chains()}
	for _, chain := range d.chains {
		for _, k := range chain {
			if envoyKeys[k] == nil {
				return fmt.Errorf("descriptor key %q: the gateway fills api_key, route, path and method", k)
			}
		}
	}
	e.current.Store(d)
	return nil
}

// watch reloads the rules at path when they change, keeping the last good ones.
func (e *envoyRules) watch(ctx context.Context, path string, log *slog.Logger) {
	envoyrules.Watch(ctx, path, time.Second, func(c *envoyrules.Config) {
		if err := e.set(c); err != nil {
			log.Error("bad Envoy rules; keeping the old rules", "path", path, "err", err)
			return
		}
		log.Info("rules loaded", "source", "envoy", "domain", c.Domains())
	}, func(err error) { log.Error("bad Envoy rules; keeping the old rules", "path", path, "err", err) })
}

// decide decides r, of tenant on route, under the rules in force: denied if any
// descriptor is over its limit, with the tightest descriptor's limit in the headers.
func (e *envoyRules) decide(r *http.Request, tenant, route string) (ratelimit.Decision, ratelimit.Rule, error) {
	d := e.current.Load()
	descriptors := make([][]envoyrules.Entry, len(d.chains))
	for i, chain := range d.chains {
		for _, k := range chain {
			descriptors[i] = append(descriptors[i], envoyrules.Entry{Key: k, Value: envoyKeys[k](r, tenant, route)})
		}
	}
	res, err := e.decider.Decide(r.Context(), d.domain, descriptors, 1)
	if err != nil {
		return ratelimit.Decision{}, ratelimit.Rule{}, err
	}
	t, ok := res.Tightest()
	if !ok { // no descriptor has a limit: nothing to say in the headers
		return ratelimit.Decision{Allowed: !res.OverLimit, Limit: 1, Remaining: 1}, ratelimit.Rule{}, nil
	}
	dec := ratelimit.Decision{Allowed: !res.OverLimit, Limit: int64(t.Match.RequestsPerUnit), Remaining: int64(t.Remaining),
		ResetAfter: t.ResetAfter}
	if res.OverLimit {
		dec.RetryAfter = max(t.ResetAfter, time.Second)
	}
	return dec, t.Match.Rule, nil
}
