// Package envoyrules reads rate limit rules in the configuration format of Envoy's rate
// limit service (envoyproxy/ratelimit), matches a request's descriptors against them as
// the service does, and decides them on any ratelimit.Store: the gateway's -envoy-rules
// and the rls example's gRPC server both run on it.
//
// A file holds one domain and its tree of descriptors:
//
//	domain: public-api
//	descriptors:
//	  - key: api_key
//	    rate_limit: {unit: minute, requests_per_unit: 100}
//	  - key: path
//	    value: /login
//	    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: slidinglog}
//
// Every key the service accepts is read (key, value, descriptors, rate_limit with unit,
// requests_per_unit, unlimited, name and replaces, shadow_mode, quota_mode,
// detailed_metric, value_to_metric, share_threshold, metadata), and any other is an
// error, as in the service; metadata is accepted and not used. One key is this library's
// own: rate_limit's algorithm, one of tokenbucket, leakybucket, fixedwindow,
// slidingwindow and slidinglog; fixedwindow, the service's own algorithm, by default.
package envoyrules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// Algorithms are the algorithms a rule may name, by name.
var Algorithms = map[string]*ratelimit.Algorithm{
	"tokenbucket":   tokenbucket.Algorithm(),
	"leakybucket":   leakybucket.Algorithm(),
	"fixedwindow":   fixedwindow.Algorithm(),
	"slidingwindow": slidingwindow.Algorithm(),
	"slidinglog":    slidinglog.Algorithm(),
}

// AlgorithmList is Algorithms' values, in the order of their names: for
// redisstore.LoadScripts before serving.
func AlgorithmList() []*ratelimit.Algorithm {
	names := make([]string, 0, len(Algorithms))
	for n := range Algorithms {
		names = append(names, n)
	}
	sort.Strings(names)
	list := make([]*ratelimit.Algorithm, len(names))
	for i, n := range names {
		list[i] = Algorithms[n]
	}
	return list
}

// DefaultAlgorithm is the algorithm of a rule that names none: the service's own.
const DefaultAlgorithm = "fixedwindow"

// Units are the units of the service, and the period of each (a month is 30 days and a
// year 365, as in the service).
var Units = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

type fileYAML struct {
	Domain      string           `yaml:"domain"`
	Descriptors []descriptorYAML `yaml:"descriptors"`
}

type descriptorYAML struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *rateLimitYAML   `yaml:"rate_limit"`
	Descriptors    []descriptorYAML `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	QuotaMode      bool             `yaml:"quota_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
	ValueToMetric  bool             `yaml:"value_to_metric"`
	ShareThreshold bool             `yaml:"share_threshold"`
	Metadata       map[string]any   `yaml:"metadata"`
}

type rateLimitYAML struct {
	RequestsPerUnit uint32        `yaml:"requests_per_unit"`
	Unit            string        `yaml:"unit"`
	Unlimited       bool          `yaml:"unlimited"`
	Name            string        `yaml:"name"`
	Replaces        []replaceYAML `yaml:"replaces"`
	Algorithm       string        `yaml:"algorithm"`
}

type replaceYAML struct {
	Name string `yaml:"name"`
}

// Limit is the rate_limit of one descriptor of the tree.
type Limit struct {
	Unit            string // lower case: "minute"
	RequestsPerUnit uint32
	Unlimited       bool
	Name            string
	Replaces        []string
	ShadowMode      bool // decide and count, never deny
	QuotaMode       bool // deny only when every quota descriptor of the request is over
	Algorithm       *ratelimit.Algorithm
	Rule            ratelimit.Rule // RequestsPerUnit per Unit; Limit 0 when RequestsPerUnit is 0 (deny all)

	key      string // the descriptor's path in the tree: "domain.key_value.key"
	detailed bool
}

// node is one descriptor of the tree, found by "key_value" or "key" in its parent.
type node struct {
	key            string // the descriptor's key
	children       map[string]*node
	wildcards      []wildcard // the children whose value holds a *, in file order
	limit          *Limit
	valueToMetric  bool
	shareThreshold bool
	pattern        string // the value of a share_threshold wildcard: "files*"
}

type wildcard struct {
	key   string   // "key_val*ue"
	parts []string // split on *
}

// Domain is one file: a domain and its descriptors.
type Domain struct {
	Name string
	File string // the name Parse was given
	root node
}

// Parse reads one file (name is for errors). Any problem is an error naming the
// descriptor: an unknown key, an empty domain or key, a descriptor twice, an unknown
// unit or algorithm, a unit with unlimited, an empty replaces name or one that names its
// own rule, share_threshold without a wildcard, a rule this library cannot count exactly.
func Parse(name string, data []byte) (*Domain, error) {
	var f fileYAML
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: empty file", name)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: a second YAML document: one file holds one domain", name)
	}
	if f.Domain == "" {
		return nil, fmt.Errorf("%s: the domain is empty", name)
	}
	d := &Domain{Name: f.Domain, File: name}
	if err := d.root.load(f.Descriptors, f.Domain+"."); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return d, nil
}

func (n *node) load(descs []descriptorYAML, parent string) error {
	n.children = make(map[string]*node, len(descs))
	for _, y := range descs {
		if y.Key == "" {
			return fmt.Errorf("a descriptor under %q has an empty key", strings.TrimSuffix(parent, "."))
		}
		final := y.Key
		if y.Value != "" {
			final += "_" + y.Value
		}
		path := parent + final
		if _, dup := n.children[final]; dup {
			return fmt.Errorf("descriptor %q is there twice", path)
		}
		child := &node{key: y.Key, valueToMetric: y.ValueToMetric, shareThreshold: y.ShareThreshold}
		if y.ShareThreshold {
			if !strings.Contains(final, "*") {
				return fmt.Errorf("descriptor %q: share_threshold needs a value with a wildcard (*)", path)
			}
			child.pattern = y.Value
		}
		if y.RateLimit != nil {
			l, err := newLimit(*y.RateLimit, y)
			if err != nil {
				return fmt.Errorf("descriptor %q: %w", path, err)
			}
			l.key = path
			child.limit = l
		}
		if strings.Contains(final, "*") {
			n.wildcards = append(n.wildcards, wildcard{key: final, parts: strings.Split(final, "*")})
		}
		if err := child.load(y.Descriptors, path+"."); err != nil {
			return err
		}
		n.children[final] = child
	}
	return nil
}

func newLimit(y rateLimitYAML, d descriptorYAML) (*Limit, error) {
	l := &Limit{Unit: strings.ToLower(y.Unit), RequestsPerUnit: y.RequestsPerUnit, Unlimited: y.Unlimited, Name: y.Name,
		ShadowMode: d.ShadowMode, QuotaMode: d.QuotaMode, detailed: d.DetailedMetric}
	period, validUnit := Units[l.Unit]
	switch {
	case y.Unlimited && validUnit:
		return nil, errors.New("a rate_limit with unlimited has no unit")
	case !y.Unlimited && !validUnit:
		return nil, fmt.Errorf("unit %q is not one of second, minute, hour, day, week, month, year", y.Unit)
	}
	for _, r := range y.Replaces {
		switch {
		case r.Name == "":
			return nil, errors.New("an entry of replaces has no name")
		case r.Name == y.Name:
			return nil, fmt.Errorf("replaces names the rule's own name %q", r.Name)
		}
		l.Replaces = append(l.Replaces, r.Name)
	}
	name := y.Algorithm
	if name == "" {
		name = DefaultAlgorithm
	}
	alg, ok := Algorithms[name]
	if !ok {
		names := make([]string, 0, len(Algorithms))
		for n := range Algorithms {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("algorithm %q is not one of %s", y.Algorithm, strings.Join(names, ", "))
	}
	l.Algorithm = alg
	if !y.Unlimited {
		l.Rule = ratelimit.Rule{Limit: int64(y.RequestsPerUnit), Period: period}
	}
	if l.Rule.Limit > 0 {
		if _, err := alg.Prepare(core.Rule(l.Rule), 1); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Config is a set of domains, one file each: the rules in force.
type Config struct {
	domains map[string]*Domain
}

// New is a Config of domains, which must have distinct names (as in the service, a
// domain is in one file).
func New(domains ...*Domain) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain, len(domains))}
	for _, d := range domains {
		if other, dup := c.domains[d.Name]; dup {
			return nil, fmt.Errorf("domain %q is in two files: %s and %s", d.Name, other.File, d.File)
		}
		c.domains[d.Name] = d
	}
	return c, nil
}

// Domain is the domain named name, or nil.
func (c *Config) Domain(name string) *Domain { return c.domains[name] }

// Domains are the names of the domains, sorted.
func (c *Config) Domains() []string {
	names := make([]string, 0, len(c.domains))
	for n := range c.domains {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Chains are the sequences of keys of the domain's tree, from each top-level descriptor
// down to each descriptor that has a rate limit, each once: what a client that builds
// descriptors from named values (the gateway does) should send.
func (d *Domain) Chains() [][]string {
	var out [][]string
	seen := map[string]bool{}
	var walk func(n *node, prefix []string)
	walk = func(n *node, prefix []string) {
		keys := make([]string, 0, len(n.children))
		for k := range n.children {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			child := n.children[k]
			chain := append(append([]string(nil), prefix...), child.key)
			if child.limit != nil {
				if id := strings.Join(chain, "\x00"); !seen[id] {
					seen[id] = true
					out = append(out, chain)
				}
			}
			walk(child, chain)
		}
	}
	walk(&d.root, nil)
	return out
}
