package redisx

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestKeyForm(t *testing.T) {
	for _, tc := range []struct{ key, form, tag string }{
		{"tenant-42", "{tenant-42}", "tenant-42"},
		{"a:b", "{a:b}", "a:b"},
		{"{shop-a}:create-order", "t:{shop-a}:create-order", "shop-a"},
		{"x{shop-a}y{z}", "t:x{shop-a}y{z}", "shop-a"},
		{"}{a}", "t:}{a}", "a"},
		{"{a}", "t:{a}", "a"},
		{"a", "{a}", "a"},
		{"", "{cbf29ce484222325}:", "cbf29ce484222325"},
		{"{}", "{" + Hash("{}") + "}:{}", Hash("{}")},
		{"a}", "{" + Hash("a}") + "}:a}", Hash("a}")},
		{"{", "{" + Hash("{") + "}:{", Hash("{")},
	} {
		pre, post := Form(tc.key)
		form := pre + tc.key + post
		if form != tc.form {
			t.Errorf("Form(%q) = %q; want %q", tc.key, form, tc.form)
		}
		for _, part := range []string{"state", "log"} {
			if tag := HashTag("rl:slidinglog:" + part + ":" + form); tag != tc.tag {
				t.Errorf("key %q, part %s: hash tag %q; want %q", tc.key, part, tag, tc.tag)
			}
		}
	}
}

// TestKeysDistinct: no two keys share a name, and every name has a hash tag (so all the
// parts of a key sit in one slot), whatever the key.
func TestKeysDistinct(t *testing.T) {
	keys := []string{"", "a", "{a}", "a}", "{a", "{}", "}", "{", "a:b", "a:b:c", "{a}:b", "a\x00",
		"\x00", "\xff\xfe", "t:a", "{t:a}", "t:{a}", "{cbf29ce484222325}:", strings.Repeat("k", 1<<20)}
	seen := map[string]string{}
	for _, k := range keys {
		pre, post := Form(k)
		form := pre + k + post
		if other, dup := seen[form]; dup {
			t.Errorf("keys %q and %q share the name %q", k, other, form)
		}
		seen[form] = k
		if HashTag("rl:x:state:"+form) == "" {
			t.Errorf("key %q: name %.40q has no hash tag", k, form)
		}
	}
}

func TestUnavailable(t *testing.T) {
	for _, err := range []error{
		context.DeadlineExceeded, io.EOF, io.ErrUnexpectedEOF, redis.ErrClosed, redis.ErrPoolTimeout,
		&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, fmt.Errorf("read: %w", syscall.ECONNRESET),
	} {
		if !Unavailable(err) {
			t.Errorf("Unavailable(%v) = false", err)
		}
	}
	for _, err := range []error{
		context.Canceled, fmt.Errorf("wrapped: %w", context.Canceled), redis.ErrNoScript,
		errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"),
	} {
		if Unavailable(err) {
			t.Errorf("Unavailable(%v) = true", err)
		}
	}
}

// TestNamesOnlyHere: no package of this module that talks to Redis builds a key name
// itself: no string it joins with + holds a colon or a brace outside this package (an
// error's words aside: what fmt or errors makes, or a panic says).
func TestNamesOnlyHere(t *testing.T) {
	var files []string
	for _, dir := range []string{"../../redisstore", "../../redisstore/hotkey", "../../redisstore/members", "../../redisstore/regions", "../../fallback"} {
		matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(matches) == 0 {
			t.Fatalf("%s: %v, %d files", dir, err, len(matches))
		}
		for _, f := range matches {
			if !strings.HasSuffix(f, "_test.go") {
				files = append(files, f)
			}
		}
	}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok { // an error's words may hold a colon
				if id, ok := call.Fun.(*ast.Ident); ok && id.Name == "panic" {
					return false
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					if pkg, ok := sel.X.(*ast.Ident); ok && (pkg.Name == "fmt" || pkg.Name == "errors") {
						return false
					}
				}
			}
			bin, ok := n.(*ast.BinaryExpr)
			if !ok || bin.Op != token.ADD {
				return true
			}
			for _, side := range []ast.Expr{bin.X, bin.Y} {
				if lit, ok := side.(*ast.BasicLit); ok && lit.Kind == token.STRING && strings.ContainsAny(lit.Value, ":{}") {
					t.Errorf("%s: %s joins a key name outside internal/redisx", fset.Position(bin.Pos()), lit.Value)
				}
			}
			return true
		})
	}
}
