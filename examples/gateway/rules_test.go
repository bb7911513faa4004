package main

import (
	"strings"
	"testing"
)

func TestEmbeddedRulesParse(t *testing.T) {
	r, err := parseRules(defaultRules)
	if err != nil {
		t.Fatal(err)
	}
	if p := r.policy("shop-a", "search"); p.alg != algorithms["slidingwindow"] || p.capacity != 25 || p.inFlight != 0 {
		t.Errorf("shop-a search: %+v", p)
	}
	if p := r.policy("shop-a", "create-order"); p.inFlight != 1 {
		t.Errorf("shop-a create-order: in flight %d; want 1", p.inFlight)
	}
}

func TestRoutes(t *testing.T) {
	r, err := parseRules([]byte(`
default: {capacity: 1, refill_per_second: 1}
routes:
  - {id: orders, prefix: /orders}
  - {id: create-order, method: post, prefix: /orders}
  - {id: order-items, prefix: /orders/items/}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/orders", "create-order"},
		{"GET", "/orders", "orders"},
		{"GET", "/orders/7", "orders"},
		{"GET", "/ordersx", "default"},
		{"GET", "/orders/items/3", "order-items"},
		{"GET", "/orders/items", "orders"},
		{"GET", "/", "default"},
	} {
		if got := r.route(tc.method, tc.path); got != tc.want {
			t.Errorf("%s %s: route %q; want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

func TestBadRules(t *testing.T) {
	for _, bad := range []string{
		`default: {capacity: 0, refill_per_second: 1}`,
		`default: {capacity: 1, refill_per_second: 1, algorithm: magic}`,
		`{default: {capacity: 1, refill_per_second: 1}, rules: [{tenant_id: a, route_id: nowhere, capacity: 1, refill_per_second: 1}]}`,
		`{default: {capacity: 1, refill_per_second: 1}, rules: [{tenant_id: a, route_id: default, capacity: 1, refill_per_second: 1}, {tenant_id: a, route_id: default, capacity: 2, refill_per_second: 1}]}`,
		`{default: {capacity: 1, refill_per_second: 1}, routes: [{id: x, prefix: nope}]}`,
		`{default: {capacity: 1, refill_per_second: 1}, typo: 1}`,
		`default: [`,
		`default: {capacity: 2.5, refill_per_second: 1}`,
		`default: {capacity: 2, refill_per_second: 1e3}`,
		"default: {capacity: 2, refill_per_second: 1}\n---\ndefault: {capacity: 3, refill_per_second: 1}\n",
		`default: {capacity: 2, refill_per_second: 1, in_flight: -1}`,
		`default: {capacity: 2, refill_per_second: 1, in_flight: 1.5}`,
	} {
		if _, err := parseRules([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "rules:") {
			t.Errorf("%s: %v; want an error", bad, err)
		}
	}
}

// TestRuleErrorsSayWhat: each error names the field at fault.
func TestRuleErrorsSayWhat(t *testing.T) {
	for bad, want := range map[string]string{
		`{default: {capacity: 1, refill_per_second: 1}, rules: [{tenant_id: "", route_id: default, capacity: 1, refill_per_second: 1}]}`: "tenant_id is empty",
		`{default: {capacity: 1, refill_per_second: 1}, rules: [{tenant_id: a, route_id: nowhere, capacity: 1, refill_per_second: 1}]}`:  `route_id "nowhere" is not a route`,
		`default: {capacity: 2.5, refill_per_second: 1}`:              `"2.5" is not a whole number`,
		`default: {capacity: 2, refill_per_second: 1, in_flight: -3}`: "in_flight -3 is negative",
		"default: {capacity: 2, refill_per_second: 1}\n---\n{}\n":     "a second YAML document",
	} {
		if _, err := parseRules([]byte(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error saying %q", bad, err, want)
		}
	}
}
