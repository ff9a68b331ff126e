package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func TestFromBuildInfo(t *testing.T) {
	rev := "6d16787abcdef0123456789abcdef0123456789a"
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, tc := range []struct {
		name      string
		bi        debug.BuildInfo
		short     string
		textHas   []string
		wantTime  time.Time
		wantDirty bool
	}{{
		name:    "go install at a tag",
		bi:      debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/fence-dev/fence", Version: "v1.2.3"}},
		short:   "v1.2.3",
		textHas: []string{"fenced v1.2.3\n", "module:   github.com/fence-dev/fence\n", "revision: unknown", "go:       go1.26.8 "},
	}, {
		name: "go build in a modified checkout",
		bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/fence-dev/fence", Version: "v0.0.0-20261205215304-6d16787abcde+dirty"},
			Settings: settings("vcs", "git", "vcs.revision", rev, "vcs.time", "2026-12-05T21:53:04Z", "vcs.modified", "true")},
		short:     "v0.0.0-20261205215304-6d16787abcde+dirty",
		textHas:   []string{"revision: " + rev + " (modified", "time:     2026-12-05T21:53:04Z\n"},
		wantTime:  time.Date(2026, 12, 5, 21, 53, 4, 0, time.UTC),
		wantDirty: true,
	}, {
		name: "a commit but no version",
		bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/fence-dev/fence", Version: "(devel)"},
			Settings: settings("vcs.revision", rev, "vcs.modified", "false")},
		short:   "(devel)-6d16787abcde",
		textHas: []string{"fenced (devel)\n", "revision: " + rev + "\n"},
	}, {
		name:    "go run",
		bi:      debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/fence-dev/fence", Version: ""}},
		short:   "(devel)",
		textHas: []string{"fenced (devel)\n"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			in := FromBuildInfo(&tc.bi)
			if got := in.Short(); got != tc.short {
				t.Errorf("Short() = %q, want %q", got, tc.short)
			}
			text := in.Text("fenced")
			for _, want := range tc.textHas {
				if !strings.Contains(text, want) {
					t.Errorf("Text lacks %q:\n%s", want, text)
				}
			}
			if !in.Time.Equal(tc.wantTime) || in.Modified != tc.wantDirty {
				t.Errorf("Time, Modified = %v, %v; want %v, %v", in.Time, in.Modified, tc.wantTime, tc.wantDirty)
			}
		})
	}
}

func TestGet(t *testing.T) {
	in := Get()
	if in.GoVersion == "" || in.Version == "" {
		t.Errorf("Get() = %+v: want a Go version and a module version", in)
	}
}

// TestBuiltFromCheckout builds a program the way go build does in a git
// checkout, with VCS stamping asked for explicitly (a machine's GOFLAGS
// may turn it off), and checks that it names the checkout's commit.
func TestBuiltFromCheckout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout, or no git: %v", err)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("git rev-parse --show-toplevel: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git")); err != nil || !fi.IsDir() {
		t.Skip("the go command stamps a build with its commit only where .git is a directory, not in a git worktree")
	}
	bin := filepath.Join(t.TempDir(), "printversion")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./testdata/printversion")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("go build -buildvcs=true: %v\n%s", err, out) // e.g. git refuses a checkout owned by another user
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	rev := strings.TrimSpace(string(head))
	for _, want := range []string{"printversion v", "revision: " + rev, "time:     20", "go:       go1."} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the build's version lacks %q:\n%s", want, out)
		}
	}
}
