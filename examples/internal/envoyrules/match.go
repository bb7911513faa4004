package envoyrules

import (
	"cmp"
	"strings"

	"github.com/ratelimit-go/ratelimit/redisstore"
)

// Entry is one (key, value) of a descriptor.
type Entry struct{ Key, Value string }

// Match is the limit a descriptor falls under, as the service finds it.
type Match struct {
	*Limit
	// MetricKey names the rule in metrics, as the service does: the descriptor's path in
	// the tree ("domain.key_value.key"), with the request's values where the tree says so
	// (detailed_metric, value_to_metric), a share_threshold wildcard as its pattern.
	MetricKey string
	// Key is what the limit counts under: the domain's and the request's entries, a
	// share_threshold wildcard's values counting together under its pattern. The first
	// entry's value is its Redis Cluster hash tag, so that a request's descriptors that
	// start alike are decided on one node, atomically.
	Key string

	namespace string // the domain's on the store
}

// Match is the limit of a descriptor, found as the service finds it, or nil: at each
// level the entry's "key_value" first, then the wildcard values in file order, then the
// key alone (any value); a limit applies only at the level of the descriptor's last
// entry, and a descriptor deeper than the tree matches nothing.
func (d *Domain) Match(entries []Entry) *Match {
	if d == nil || len(entries) == 0 {
		return nil
	}
	n := &d.root
	var limit *Limit
	shared := make([]string, len(entries)) // share_threshold patterns, by entry
	anyShared := false
	var detailed, named strings.Builder
	detailed.WriteString(d.Name)
	named.WriteString(d.Name)
	for i, e := range entries {
		final := e.Key + "_" + e.Value
		detailed.WriteString("." + final)
		next, wild := n.children[final], ""
		if next == nil {
			for _, w := range n.wildcards {
				if wildcardMatch(w.parts, final) {
					next, wild = n.children[w.key], w.key
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = n.children[e.Key]
		}
		if wild != "" && next.shareThreshold {
			shared[i], anyShared = next.pattern, true
		}
		named.WriteString("." + e.Key)
		if next != nil {
			v := ""
			switch {
			case wild != "" && shared[i] != "":
				v = shared[i]
			case wild != "" && !next.valueToMetric:
				v = strings.TrimPrefix(wild, e.Key+"_")
			case byValue || next.valueToMetric:
				v = e.Value
			}
			if v != "" {
				named.WriteString("_" + v)
			}
		}
		if next != nil && next.limit != nil && i == len(entries)-1 {
			limit = next.limit
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		n = next
	}
	if limit == nil {
		return nil
	}
	m := &Match{Limit: limit, MetricKey: named.String(), namespace: Namespace(d.Name)}
	if limit.detailed {
		m.MetricKey = detailed.String()
		if anyShared {
			var b strings.Builder
			b.WriteString(d.Name)
			for i, e := range entries {
				b.WriteString("." + e.Key)
				if v := cmp.Or(shared[i], e.Value); v != "" {
					b.WriteString("_" + v)
				}
			}
			m.MetricKey = b.String()
		}
	}
	parts := make([]string, 0, 2*len(entries))
	for i, e := range entries {
		parts = append(parts, e.Key, cmp.Or(shared[i], e.Value))
	}
	m.Key = redisstore.TaggedKey(parts[1], parts...)
	return m
}

// wildcardMatch reports whether value matches a pattern split on its *s, each * any run of
// characters (none included).
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	middle := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(middle, p)
		if i < 0 {
			return false
		}
		middle = middle[i+len(p):]
	}
	return true
}
