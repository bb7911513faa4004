package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/internal/envoyrules"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// defaultRoute is the route of a request that matches no route of the table.
const defaultRoute = "default"

// algorithms are the algorithms a rule may name, by name.
var algorithms = envoyrules.Algorithms

// spec is one rule as written: in the YAML file, or a row of rate_limit_rule.
type spec struct {
	TenantID        string `yaml:"tenant_id"`
	RouteID         string `yaml:"route_id"`
	Capacity        count  `yaml:"capacity"`
	RefillPerSecond count  `yaml:"refill_per_second"`
	Algorithm       string `yaml:"algorithm"`
	InFlight        count  `yaml:"in_flight"` // requests in progress at once; 0: no such limit
	// Quota is a calendar quota beside the rate, as fixedwindow.Quota's text ("10000 per
	// month in America/New_York"); empty: none. It is the tenant's, counted across the
	// routes whose rules give it the same quota.
	Quota string `yaml:"quota"`
}

// count is a whole number of requests in the rules file. yaml.v3 would truncate 2.5 into
// an int64 without a word; a rule that says 2.5 is refused instead.
type count int64

func (c *count) UnmarshalYAML(node *yaml.Node) error {
	n, err := strconv.ParseInt(node.Value, 10, 64)
	if node.Kind != yaml.ScalarNode || err != nil {
		return fmt.Errorf("line %d: %q is not a whole number of requests", node.Line, node.Value)
	}
	*c = count(n)
	return nil
}

type routeSpec struct {
	ID     string `yaml:"id"`
	Method string `yaml:"method"` // empty: any method
	Prefix string `yaml:"prefix"`
	// Priority is the class of the route's requests, for -reserves: critical, normal
	// (when empty) or sheddable. Routes of one id share its limits, so a POST and a GET
	// of one id can be of different classes within one (tenant, route) limit.
	Priority string `yaml:"priority"`
}

// parsePriority reads a class: critical, normal or sheddable.
func parsePriority(s string) (ratelimit.Priority, bool) {
	for _, p := range []ratelimit.Priority{ratelimit.Critical, ratelimit.Normal, ratelimit.Sheddable} {
		if s == p.String() {
			return p, true
		}
	}
	return 0, false
}

type file struct {
	Default spec        `yaml:"default"`
	Routes  []routeSpec `yaml:"routes"`
	Rules   []spec      `yaml:"rules"`
}

// policy is one rule ready to decide with.
type policy struct {
	alg      *ratelimit.Algorithm
	rule     ratelimit.Rule
	capacity int64  // what the rule allows at once
	inFlight int64  // the requests in progress at once; 0: no limit
	quota    *quota // nil: none
}

// quota is a rule's calendar quota, ready to decide with.
type quota struct {
	fixedwindow.Quota
	alg *ratelimit.Algorithm
}

func (s spec) policy() (policy, error) {
	name := s.Algorithm
	if name == "" {
		name = "tokenbucket"
	}
	alg, ok := algorithms[name]
	if !ok {
		return policy{}, fmt.Errorf("unknown algorithm %q", s.Algorithm)
	}
	if s.Capacity < 1 || s.RefillPerSecond < 1 {
		return policy{}, fmt.Errorf("capacity %d and refill_per_second %d must both be at least 1", s.Capacity, s.RefillPerSecond)
	}
	if s.InFlight < 0 {
		return policy{}, fmt.Errorf("in_flight %d is negative (0, or no in_flight, means no such limit)", s.InFlight)
	}
	rule := ratelimit.Rule{Limit: int64(s.RefillPerSecond), Period: time.Second, Burst: int64(s.Capacity)}
	a, err := alg.Prepare(core.Rule(rule), 1)
	if err != nil {
		return policy{}, err
	}
	p := policy{alg: alg, rule: rule, capacity: a.Limit, inFlight: int64(s.InFlight)}
	if s.Quota != "" {
		p.quota = &quota{}
		if err := p.quota.UnmarshalText([]byte(s.Quota)); err != nil {
			return policy{}, err
		}
		if p.quota.alg, err = p.quota.Algorithm(); err != nil {
			return policy{}, err
		}
	}
	return p, nil
}

// quotaNamespace prefixes the namespace of a quota (its text), apart from the rates'.
const quotaNamespace = "gateway-quota:"

type route struct {
	id, method, prefix string
	priority           ratelimit.Priority
}

// Rules is one snapshot of the rule table; it never changes once built.
type Rules struct {
	def    policy
	routes []route // longest prefix first, then method-specific first
	rules  map[[2]string]policy
	file   file // as parsed, so that rows from a database can replace its rules
}

// parseRules reads a rules file and checks all of it: any error rejects the whole file.
func parseRules(data []byte) (*Rules, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("rules: a second YAML document (after ---): one file holds one document")
	}
	return f.build(f.Rules)
}

// build makes Rules of f's default and routes with rows as its rules.
func (f file) build(rows []spec) (*Rules, error) {
	def, err := f.Default.policy()
	if err != nil {
		return nil, fmt.Errorf("rules: default: %w", err)
	}
	rs := &Rules{def: def, rules: make(map[[2]string]policy), file: f}
	ids := map[string]bool{defaultRoute: true}
	for i, r := range f.Routes {
		if r.ID == "" || !strings.HasPrefix(r.Prefix, "/") {
			return nil, fmt.Errorf("rules: route %d: an id and a prefix starting with / are required", i+1)
		}
		ids[r.ID] = true
		p, ok := ratelimit.Normal, true
		if r.Priority != "" {
			p, ok = parsePriority(r.Priority)
		}
		if !ok {
			return nil, fmt.Errorf("rules: route %d (%s): priority %q: want critical, normal or sheddable", i+1, r.ID, r.Priority)
		}
		// lower case: routes match paths without regard to case (see route)
		rs.routes = append(rs.routes, route{id: r.ID, method: strings.ToUpper(r.Method), prefix: strings.ToLower(r.Prefix), priority: p})
	}
	// the longest prefix first; for one prefix, a route for one method before one for any
	sort.SliceStable(rs.routes, func(i, j int) bool {
		a, b := rs.routes[i], rs.routes[j]
		if len(a.prefix) != len(b.prefix) {
			return len(a.prefix) > len(b.prefix)
		}
		return a.method != "" && b.method == ""
	})
	for i, row := range rows {
		if row.TenantID == "" {
			return nil, fmt.Errorf("rules: rule %d: tenant_id is empty", i+1)
		}
		if !ids[row.RouteID] {
			return nil, fmt.Errorf("rules: rule %d (%s): route_id %q is not a route of the file", i+1, row.TenantID, row.RouteID)
		}
		p, err := row.policy()
		if err != nil {
			return nil, fmt.Errorf("rules: rule %d (%s, %s): %w", i+1, row.TenantID, row.RouteID, err)
		}
		key := [2]string{row.TenantID, row.RouteID}
		if _, dup := rs.rules[key]; dup {
			return nil, fmt.Errorf("rules: rule %d: (%s, %s) is there twice", i+1, row.TenantID, row.RouteID)
		}
		rs.rules[key] = p
	}
	return rs, nil
}

// withRows is rs with rows (from a database) as its rules, keeping its default and routes.
func (rs *Rules) withRows(rows []spec) (*Rules, error) { return rs.file.build(rows) }

// route is the id of the route of a request: the longest matching prefix (as a whole path
// segment: /orders matches /orders and /orders/7, not /ordersx; without regard to case,
// /ORDERS too), a route for the request's method before one for any method, or
// defaultRoute.
func (rs *Rules) route(method, path string) string { return rs.match(method, path).id }

// match is the route of a request, as route says; a request no route matches is of
// defaultRoute, at Normal priority.
func (rs *Rules) match(method, path string) route {
	path = strings.ToLower(path) // as an upstream that folds case serves it
	for _, r := range rs.routes {
		if r.method != "" && r.method != method {
			continue
		}
		if path == r.prefix || strings.HasPrefix(path, strings.TrimSuffix(r.prefix, "/")+"/") {
			return r
		}
	}
	return route{id: defaultRoute, priority: ratelimit.Normal}
}

// policy is the rule of (tenant, route): its own, or the default.
func (rs *Rules) policy(tenant, route string) policy {
	if p, ok := rs.rules[[2]string{tenant, route}]; ok {
		return p
	}
	return rs.def
}
