package main

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestReadmeRules: the rules the gateway's README shows as its embedded default are
// those of rules.yaml, read by the gateway's own parser.
func TestReadmeRules(t *testing.T) {
	embedded, err := parseRules(defaultRules)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"README.md"} {
		readme, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile("(?s)<!-- rules: examples/gateway/rules.yaml -->\n *```yaml\n(.*?)```").FindSubmatch(readme)
		if m == nil {
			t.Fatalf("%s has no block of the default rules", path)
		}
		var block strings.Builder
		for _, line := range strings.Split(string(m[1]), "\n") {
			block.WriteString(strings.TrimPrefix(line, "  ") + "\n") // the block's indent in a list item
		}
		shown, err := parseRules([]byte(block.String()))
		if err != nil {
			t.Fatalf("%s: the rules do not parse: %v\n%s", path, err, block.String())
		}
		if !reflect.DeepEqual(shown.file, embedded.file) {
			t.Errorf("%s: the rules are not rules.yaml's:\nREADME %+v\nrules.yaml %+v", path, shown.file, embedded.file)
		}
	}
}

// TestReadmeRegionsRecipe: the gateway's README's two-region recipe starts each Redis where no
// other server can already be (a socket in a new directory: a fixed port may be taken,
// and the gateways would then write to another's Redis), and its -regions value is one
// the gateway reads.
func TestReadmeRegionsRecipe(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- recipe: two regions -->\n```\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("the README has no two-region recipe")
	}
	recipe := string(m[1])
	for _, line := range strings.Split(recipe, "\n") {
		if strings.Contains(line, "redis-server") && regexp.MustCompile(`--port [1-9]`).MatchString(line) {
			t.Errorf("the recipe starts Redis on a fixed port: %s", line)
		}
	}
	r := regexp.MustCompile(`(?m)^R=(\S+)`).FindStringSubmatch(recipe)
	if r == nil {
		t.Fatal("the recipe sets no R")
	}
	regions, err := parseRegions(strings.ReplaceAll(r[1], "$D", t.TempDir()))
	if err != nil || len(regions) != 2 {
		t.Fatalf("-regions %s: %v, %v", r[1], regions, err)
	}
	for name, url := range regions {
		if opts, err := redis.ParseURL(url); err != nil || opts.Network != "unix" {
			t.Errorf("region %s at %s: %+v, %v; want a unix socket", name, url, opts, err)
		}
	}
}
