package ratelimit_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxNames bounds the root package's exported names as go doc lists them (functions,
// types, methods of exported types, constants and variables; struct fields and interface
// methods aside) outside the files of its two middlewares, net/http's (http*.go) and the
// interceptors' (interceptor.go). The root is the user's API, read as a manual: the
// limiters, Decision, Rule and its helpers, Wait, Key, the errors, Charge, priorities,
// AllowAll, Denials, the in-flight limiter, and Store and Algorithm as values to pass on.
// The store contract (requests, outcomes, states, loans) is internal/core's.
const maxNames = 60

func TestExportedNames(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var names []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || strings.HasPrefix(f, "http") || f == "interceptor.go" {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					names = append(names, d.Name.Name)
					continue
				}
				recv := d.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if id, ok := recv.(*ast.Ident); ok && id.IsExported() {
					names = append(names, id.Name+"."+d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	if len(names) < 20 { // the parse found the package at all
		t.Fatalf("%d exported names: %v", len(names), names)
	}
	if len(names) > maxNames {
		t.Errorf("%d exported names outside the middlewares' files, more than %d: %v", len(names), maxNames, names)
	}
}

// TestDocsSayNoRegisters: the root's exported docs say what a thing is and does; how it
// fits in registers or words of memory is for comments on unexported code.
func TestDocsSayNoRegisters(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	mechanism := regexp.MustCompile(`(?i)\bregisters?\b|\b(two|three|four|five) words\b|\bwords of memory\b`)
	check := func(where string, g *ast.CommentGroup) {
		if g != nil && mechanism.MatchString(g.Text()) {
			t.Errorf("%s: the doc of an exported name says how it fits in memory: %q", where, mechanism.FindString(g.Text()))
		}
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() {
					check(f+": "+d.Name.Name, d.Doc)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok || !ts.Name.IsExported() {
						continue
					}
					check(f+": "+ts.Name.Name, d.Doc)
					check(f+": "+ts.Name.Name, ts.Doc)
					if st, ok := ts.Type.(*ast.StructType); ok {
						for _, field := range st.Fields.List {
							if len(field.Names) > 0 && field.Names[0].IsExported() {
								check(f+": "+ts.Name.Name+"."+field.Names[0].Name, field.Doc)
								check(f+": "+ts.Name.Name+"."+field.Names[0].Name, field.Comment)
							}
						}
					}
				}
			}
		}
	}
}
