package fsm

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestForbiddenImports keeps the state machine pure: no I/O, no clock, no
// randomness, no goroutines, no locks. Replicas agree only if Apply is a
// function of the state and the command.
func TestForbiddenImports(t *testing.T) {
	allowed := map[string]bool{
		"bytes": true, "encoding/json": true, "errors": true, "fmt": true, "hash/crc32": true,
		"slices": true, "strconv": true, "strings": true, "time": true,
		"github.com/fence-dev/fence": true,
	}
	forbiddenCalls := map[string]bool{
		"time.Now": true, "time.Since": true, "time.Until": true, "time.Sleep": true, "time.After": true,
		"time.AfterFunc": true, "time.NewTimer": true, "time.NewTicker": true, "time.Tick": true,
	}
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
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !allowed[path] {
				t.Errorf("%s imports %q: internal/fsm must stay pure", name, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: a go statement at %v", name, fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && forbiddenCalls[x.Name+"."+n.Sel.Name] {
					t.Errorf("%s: %s.%s at %v reads or waits on the clock", name, x.Name, n.Sel.Name, fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
