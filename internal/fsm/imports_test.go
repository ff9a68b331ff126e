package fsm

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// allowedImports is all the state machine may import: no I/O, no clock, no
// randomness, no goroutines, no locks.
var allowedImports = []string{
	"bytes", "encoding/hex", "encoding/json", "errors", "fmt", "hash/crc32", "maps", "slices", "strconv", "strings", "time", "unicode/utf8",
	// Snapshots stream to and from a writer and a reader the caller gives.
	"io",
	"iter",
	// Holders and owners are interned: a canonical copy of an immutable
	// string, which changes no value.
	"unique",
	"github.com/fence-dev/fence",
	// An ordered index of held scopes; a data structure, no I/O.
	"github.com/google/btree",
	// The binary entries of log format 6 and their codec, as encoding/json
	// is for the earlier ones.
	"github.com/fence-dev/fence/api/fence/log/v1", "google.golang.org/protobuf/proto",
}

// forbiddenSelectors read or wait on a clock, or synchronise goroutines.
// "time" is allowed for time.Duration only.
var forbiddenSelectors = map[string][]string{
	"time": {"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "NewTimer", "NewTicker", "Tick"},
}

// impurities reports what makes a source file of the state machine impure.
func impurities(fset *token.FileSet, f *ast.File) []string {
	var out []string
	report := func(n ast.Node, format string, args ...any) {
		out = append(out, fset.Position(n.Pos()).String()+": "+fmt.Sprintf(format, args...))
	}
	local := map[string]string{} // local import name → path
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if !slices.Contains(allowedImports, path) {
			report(imp, "imports %q", path)
		}
		name := path[strings.LastIndexByte(path, '/')+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		if name == "." || name == "_" {
			report(imp, "imports %q as %s", path, name)
		}
		local[name] = path
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			report(n, "a go statement")
		case *ast.SelectorExpr:
			x, ok := n.X.(*ast.Ident)
			if !ok {
				break
			}
			path, ok := local[x.Name]
			if !ok && (x.Name == "sync" || x.Name == "time") {
				path = x.Name // a mention without an import does not compile, but say so anyway
			}
			if path == "sync" || strings.HasPrefix(path, "sync/") {
				report(n, "uses %s.%s", x.Name, n.Sel.Name)
			}
			if slices.Contains(forbiddenSelectors[path], n.Sel.Name) {
				report(n, "uses %s.%s", path, n.Sel.Name)
			}
		}
		return true
	})
	return out
}

// TestForbiddenImports keeps the state machine pure (like pebble's test of
// the same name): replicas agree only if Apply is a function of the state
// and the command.
func TestForbiddenImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, p := range impurities(fset, f) {
			t.Errorf("%s: internal/fsm must stay pure", p)
		}
	}
	if checked < 4 {
		t.Fatalf("checked %d source files; the package has more", checked)
	}
}

// TestImpuritiesFindsWhatItMust: a purity check that cannot fail proves
// nothing.
func TestImpuritiesFindsWhatItMust(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      int // number of reports
	}{
		{"pure", `import ("time"; "github.com/fence-dev/fence"); var d time.Duration; var _ = fence.MaxToken`, 0},
		{"os", `import "os"; var _ = os.Args`, 1},
		{"math/rand", `import "math/rand/v2"; var _ = rand.Int`, 1},
		{"crypto/rand", `import "crypto/rand"; var _ = rand.Reader`, 1},
		{"net", `import "net"; var _ net.Conn`, 1},
		{"sync", `import "sync"; var mu sync.Mutex`, 2},
		{"sync/atomic", `import "sync/atomic"; var n atomic.Int64`, 2},
		{"time.Now", `import "time"; var _ = time.Now()`, 1},
		{"time.Since", `import "time"; var _ = time.Since`, 1},
		{"time.Until", `import "time"; var _ = time.Until`, 1},
		{"time.Sleep", `import "time"; func f() { time.Sleep(1) }`, 1},
		{"time.After", `import "time"; var _ = time.After(1)`, 1},
		{"time.NewTimer", `import "time"; var _ = time.NewTimer(1)`, 1},
		{"time.Tick", `import "time"; var _ = time.Tick(1)`, 1},
		{"time under another name", `import clock "time"; var _ = clock.Now()`, 1},
		{"dot import", `import . "strings"; var _ = ToUpper`, 1},
		{"go statement", `func f() { go f() }`, 1},
	} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, tc.name+".go", "package fsm; "+tc.src, 0)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := impurities(fset, f); len(got) != tc.want {
			t.Errorf("%s: %d reports %q, want %d", tc.name, len(got), got, tc.want)
		}
	}
}
