package fence_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReadmeExample keeps the README's Go example compiling: the block
// must be the end of testdata/readme/main.go, word for word, and that
// program must build.
func TestReadmeExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile(filepath.Join("testdata", "readme", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, b := range strings.Split(string(readme), "```go\n")[1:] {
		b, _, _ = strings.Cut(b, "```")
		if strings.Contains(b, "func work(") {
			block = b
		}
	}
	if block == "" {
		t.Fatal("README.md has no Go block with func work")
	}
	if !strings.HasSuffix(string(prog), "\n"+block) {
		t.Errorf("README.md's example is not the end of testdata/readme/main.go; copy one to the other:\n%s", block)
	}
	goCmd(t, ".", nil, "build", "-o", filepath.Join(t.TempDir(), "readme"), "./testdata/readme")
}

// heavy are module paths a program that imports only client and
// guard/httpguard must not need: database drivers, Redis, the AWS SDK,
// gRPC, SQLite, the verification harness's checker, property testing and
// Raft.
var heavy = []string{
	"github.com/jackc/pgx",
	"github.com/lib/pq",
	"github.com/go-sql-driver/mysql",
	"modernc.org/sqlite",
	"github.com/mattn/go-sqlite3",
	"github.com/redis/go-redis",
	"github.com/aws/aws-sdk-go-v2",
	"github.com/aws/smithy-go",
	"google.golang.org/grpc",
	"github.com/anishathalye/porcupine",
	"pgregory.net/rapid",
	"github.com/hashicorp/raft",
}

// TestLeanImports builds a module of its own that imports only client and
// guard/httpguard from this checkout (a replace directive), lets go mod
// tidy write its go.mod, and fails if a heavy dependency is in it. Module
// graph pruning keeps them out as long as the adapters that need them
// stay in packages of their own. go mod tidy may need the module proxy.
func TestLeanImports(t *testing.T) {
	if testing.Short() {
		t.Skip("needs go mod tidy, which may download modules")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/lean\n\ngo 1.26.0\n\nrequire github.com/fence-dev/fence v0.0.0\n\nreplace github.com/fence-dev/fence => "+root+"\n")
	// The imports decide go.mod; the uses only keep the program linking
	// both, whatever their signatures become.
	write("main.go", `package main

import (
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard/httpguard"
)

var _, _ = client.New, httpguard.Middleware

func main() {}
`)
	env := []string{"GOFLAGS=-mod=mod", "GOWORK=off"}
	goCmd(t, dir, env, "mod", "tidy")
	goCmd(t, dir, env, "build", "-o", filepath.Join(dir, "lean"), ".")
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mod), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		path := f[0]
		if path == "require" && len(f) > 1 {
			path = f[1]
		}
		for _, h := range heavy {
			if path == h || strings.HasPrefix(path, h+"/") || strings.HasPrefix(path, h+"-") {
				t.Errorf("a program importing only client and httpguard requires %s:\n%s", path, mod)
			}
		}
	}
}

// goCmd runs the go command in dir and fails the test if it fails.
func goCmd(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
