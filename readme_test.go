package ratelimit_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeSnippets: each Go block of the README marked "<!-- example: Name -->" is the
// body of the runnable Example of that name (or holds it whole, around a main), so that
// the README's code compiles and prints what the Example's Output says.
func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)<!-- example: (\\w+) -->\n```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) < 5 {
		t.Fatalf("%d marked blocks in the README; want the quickstart, namespaces, AllowRule, AllowAll and Middleware", len(blocks))
	}
	for _, b := range blocks {
		name, block := b[1], b[2]
		body, ok := exampleBody(string(src), name)
		if !ok {
			t.Errorf("README block %s: no such Example in example_test.go", name)
			continue
		}
		if !strings.Contains(body, block) && !strings.Contains(dedent(block), body) {
			t.Errorf("README block %s differs from its Example:\n--- README\n%s--- Example\n%s", name, block, body)
		}
	}
}

// exampleBody is the body of func name in src, one tab of indent removed, up to its
// Output comment.
func exampleBody(src, name string) (string, bool) {
	start := strings.Index(src, "\nfunc "+name+"() {\n")
	if start < 0 {
		return "", false
	}
	rest := src[start+len("\nfunc "+name+"() {\n"):]
	end := strings.Index(rest, "\n}\n")
	var b strings.Builder
	for _, line := range strings.Split(rest[:end+1], "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "// Output:") {
			break
		}
		b.WriteString(strings.TrimPrefix(line, "\t") + "\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n", true
}

// dedent removes one tab from each line: a main's body in a README program.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "\n")
}

// TestDocsNameNamespaces: every limiter the package docs build names its namespace, as
// the README advises (a limiter without one counts under its rule's, and starts every key
// afresh when the rule changes).
func TestDocsNameNamespaces(t *testing.T) {
	build := regexp.MustCompile(`\b(tokenbucket|fixedwindow|slidingwindow|slidinglog|leakybucket)\.New\(`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && (path == "internal" || path == "examples") {
			if err == nil {
				err = filepath.SkipDir
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(line, "//") && build.MatchString(line) && !strings.Contains(line, "WithNamespace") {
				t.Errorf("%s:%d: a limiter without a namespace in a doc: %s", path, i+1, line)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
