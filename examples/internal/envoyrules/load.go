package envoyrules

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Load reads the rules at path: one file, or every .yaml and .yml file of a directory
// (one domain each, as the service reads its directory). Any bad file fails the whole.
func Load(path string) (*Config, error) {
	files, err := ruleFiles(path)
	if err != nil {
		return nil, err
	}
	var domains []*Domain
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		d, err := Parse(f, data)
		if err != nil {
			return nil, err
		}
		domains = append(domains, d)
	}
	return New(domains...)
}

// ruleFiles are the files of path, sorted.
func ruleFiles(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if ext := strings.ToLower(filepath.Ext(e.Name())); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no .yaml or .yml file", path)
	}
	sort.Strings(files)
	return files, nil
}

// Watch loads the rules at path again whenever a file of it changes (its name, size or
// modification time, checked every check) and hands each good load to set; a bad one
// goes to bad, once until the files change again, and the rules in force stay. It
// returns when ctx ends.
func Watch(ctx context.Context, path string, check time.Duration, set func(*Config), bad func(error)) {
	last, problem := "", ""
	t := time.NewTicker(check)
	defer t.Stop()
	for {
		if state := stamp(path); state != last {
			last = state
			c, err := Load(path)
			switch {
			case err == nil:
				set(c)
				problem = ""
			case err.Error() != problem:
				problem = err.Error()
				bad(err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stamp is what Watch compares: every rule file's name, size and modification time.
func stamp(path string) string {
	files, err := ruleFiles(path)
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	for _, f := range files {
		if info, err := os.Stat(f); err == nil {
			fmt.Fprintf(&b, "%s %d %d\n", f, info.Size(), info.ModTime().UnixNano())
		}
	}
	return b.String()
}
