// Sentences measures the sentences of the library's exported docs as go doc -all prints
// them: how many, their average length in words, and those longer than a bound.
//
//	go run ./internal/tools/sentences            # every library package, a summary
//	go run ./internal/tools/sentences -v         # and every sentence over -over words
//	go run ./internal/tools/sentences -check     # exit 1 past -avg or -max
//
// A sentence ends at a '.', '!' or '?' followed by a capital, a digit or a quote, or at
// the end of its paragraph or list item. Code blocks and declarations are not prose;
// the comments of exported fields are.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"unicode"
)

type sentence struct {
	pkg   string
	words int
	text  string
}

func main() {
	over := flag.Int("over", 40, "list the sentences of more than this many words (-v)")
	verbose := flag.Bool("v", false, "list the sentences over -over words")
	check := flag.Bool("check", false, "exit 1 when the average passes -avg or a sentence -max")
	avg := flag.Float64("avg", 15, "the most average words a sentence (-check)")
	most := flag.Int("max", 40, "the most words of one sentence (-check)")
	flag.Parse()
	pkgs := flag.Args()
	if len(pkgs) == 0 {
		var err error
		if pkgs, err = libraryPackages(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	var all []sentence
	for _, p := range pkgs {
		out, err := exec.Command("go", "doc", "-all", p).Output()
		if err != nil {
			fmt.Fprintf(os.Stderr, "go doc -all %s: %v\n", p, err)
			os.Exit(2)
		}
		for _, s := range split(prose(string(out))) {
			all = append(all, sentence{pkg: p, words: len(strings.Fields(s)), text: s})
		}
	}
	if len(all) == 0 {
		fmt.Println("no sentences")
		return
	}
	words, over25, overMax := 0, 0, 0
	longest := all[0]
	for _, s := range all {
		words += s.words
		if s.words > 25 {
			over25++
		}
		if s.words > *over {
			overMax++
		}
		if s.words > longest.words {
			longest = s
		}
	}
	mean := float64(words) / float64(len(all))
	fmt.Printf("%d packages, %d sentences, %.1f words on average, %d over 25 words, %d over %d, the longest %d (%s)\n",
		len(pkgs), len(all), mean, over25, overMax, *over, longest.words, longest.pkg)
	if *verbose {
		sort.SliceStable(all, func(i, j int) bool { return all[i].words > all[j].words })
		for _, s := range all {
			if s.words <= *over {
				break
			}
			fmt.Printf("%3d %s: %s\n", s.words, s.pkg, s.text)
		}
	}
	if *check && (mean > *avg || longest.words > *most) {
		os.Exit(1)
	}
}

// libraryPackages are the module's packages a user imports: not internal, not examples.
func libraryPackages() ([]string, error) {
	out, err := exec.Command("go", "list", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list ./...: %w", err)
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		if !strings.Contains(p, "/internal/") && !strings.Contains(p, "/examples/") {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs, nil
}

// prose is the paragraphs and list items of go doc's output, each on one line: its doc
// text (indented four spaces, a list item six, its continuation eight) and the comments
// of fields in declarations. A line indented eight that continues no list item is code.
// The package doc, first, is read four spaces further in.
func prose(doc string) []string {
	var paras []string
	var cur strings.Builder
	flush := func() {
		if t := strings.TrimSpace(cur.String()); t != "" {
			paras = append(paras, t)
		}
		cur.Reset()
	}
	inItem := false
	// the package doc comes first, four spaces less indented than a declaration's: its
	// text at 0, a list item at 2 and its continuation at 4, its code at 4
	pkgDoc, first := true, true
	sc := bufio.NewScanner(strings.NewReader(doc))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if first { // "package x // import ..."
			first = false
			continue
		}
		if pkgDoc && section(line) {
			pkgDoc = false
		}
		if pkgDoc && strings.TrimSpace(line) != "" {
			line = "    " + line
		}
		trimmed := strings.TrimLeft(line, " ")
		indent := len(line) - len(trimmed)
		switch {
		case strings.TrimSpace(line) == "", strings.TrimSpace(line) == "//":
			flush()
			inItem = false
		case strings.HasPrefix(strings.TrimLeft(line, "\t"), "// ") && strings.HasPrefix(line, "\t"):
			// a field's comment in a declaration: one paragraph per comment
			text := strings.TrimPrefix(strings.TrimLeft(line, "\t"), "// ")
			switch {
			case strings.HasPrefix(text, "Has unexported"):
				continue
			case strings.HasPrefix(text, "- "), strings.HasPrefix(text, "  - "): // a list item
				flush()
				text = strings.TrimLeft(text, " -")
			}
			cur.WriteString(text + " ")
		case indent == 4 && strings.HasPrefix(trimmed, "# "): // a heading
			flush()
		case indent == 4:
			if inItem {
				flush()
				inItem = false
			}
			cur.WriteString(trimmed + " ")
		case indent == 6 && (strings.HasPrefix(trimmed, "- ") || isNumbered(trimmed)):
			flush()
			inItem = true
			cur.WriteString(strings.TrimLeft(trimmed, "-0123456789. ") + " ")
		case indent == 8 && inItem:
			cur.WriteString(trimmed + " ")
		default: // a declaration or code
			flush()
			inItem = false
		}
	}
	flush()
	return paras
}

// section reports whether line is one of go doc -all's headings after the package doc.
func section(line string) bool {
	switch line {
	case "CONSTANTS", "VARIABLES", "FUNCTIONS", "TYPES":
		return true
	}
	return false
}

func isNumbered(s string) bool {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i > 0 && i+1 < len(s) && s[i] == '.' && s[i+1] == ' '
}

// split cuts paragraphs into sentences.
func split(paras []string) []string {
	var out []string
	for _, p := range paras {
		words := strings.Fields(p)
		start := 0
		for i, w := range words {
			end := strings.TrimRight(w, `)"'`)
			if i+1 < len(words) && end != "" && strings.ContainsAny(end[len(end)-1:], ".!?") && starts(words[i+1]) && !abbreviation(end) {
				out = append(out, strings.Join(words[start:i+1], " "))
				start = i + 1
			}
		}
		if start < len(words) {
			out = append(out, strings.Join(words[start:], " "))
		}
	}
	return out
}

// starts reports whether w may begin a sentence: a capital, a digit, a quote or code.
func starts(w string) bool {
	r := []rune(strings.TrimLeft(w, `("'`+"`"))
	return len(r) > 0 && (unicode.IsUpper(r[0]) || unicode.IsDigit(r[0])) || strings.HasPrefix(w, "`")
}

func abbreviation(w string) bool {
	switch strings.ToLower(w) {
	case "e.g.", "i.e.", "vs.", "etc.":
		return true
	}
	return false
}
