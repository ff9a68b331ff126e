package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
			checkShortAndText(t, in, tc.short, tc.textHas)
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

func TestStamped(t *testing.T) {
	rev := "751c299d7451aa0fa672d214c002a4a5952b1f2e"
	devel := Info{Module: "github.com/fence-dev/fence", Version: Devel, GoVersion: "go1.26.8"}
	for _, tc := range []struct {
		name                         string
		in                           Info
		version, revision, tm, dirty string
		short                        string
		textHas                      []string
	}{{
		name: "no stamps: what the go command recorded",
		in:   devel, short: "(devel)",
		textHas: []string{"revision: unknown (the build recorded no commit: go run, go test, -buildvcs=false in GOFLAGS"},
	}, {
		name: "a commit, no tag", in: devel,
		revision: rev, tm: "2026-12-07T04:32:44+00:00", dirty: "false",
		short:   "(devel)-751c299d7451",
		textHas: []string{"fenced (devel)\n", "revision: " + rev + "\n", "time:     2026-12-07T04:32:44Z\n"},
	}, {
		name: "a tag and a modified checkout", in: devel,
		version: "v0.3.0-12-g751c299", revision: rev, tm: "2026-12-07T04:32:44Z", dirty: "true",
		short:   "v0.3.0-12-g751c299+dirty",
		textHas: []string{"fenced v0.3.0-12-g751c299+dirty\n", "revision: " + rev + " (modified"},
	}, {
		name:     "the stamp replaces the go command's record",
		in:       Info{Version: "v0.0.0-20261205215304-6d16787abcde", Revision: "6d16787abcde", Modified: true, Time: time.Unix(1, 0)},
		revision: rev, tm: "2026-12-07T04:32:44Z", dirty: "false",
		short:   "v0.0.0-20261205215304-6d16787abcde",
		textHas: []string{"revision: " + rev + "\n", "time:     2026-12-07T04:32:44Z\n"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			checkShortAndText(t, tc.in.Stamped(tc.version, tc.revision, tc.tm, tc.dirty), tc.short, tc.textHas)
		})
	}
}

// checkShortAndText checks in's Short and that its Text for fenced has
// each of textHas.
func checkShortAndText(t *testing.T, in Info, short string, textHas []string) {
	t.Helper()
	if got := in.Short(); got != short {
		t.Errorf("Short() = %q, want %q", got, short)
	}
	text := in.Text("fenced")
	for _, want := range textHas {
		if !strings.Contains(text, want) {
			t.Errorf("Text lacks %q:\n%s", want, text)
		}
	}
}

// TestMakefileStamps builds a program with the linker flags the Makefile's
// builds use (make version-ldflags), under GOFLAGS=-buildvcs=false, which
// turns the go command's own record of the commit off, and checks that
// the program names the checkout's commit all the same.
func TestMakefileStamps(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	if _, err := exec.Command("git", "rev-parse", "HEAD").Output(); err != nil {
		t.Skipf("not a git checkout, or no git: %v", err)
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	flags, err := exec.Command("make", "-s", "--no-print-directory", "-C", "../..", "version-ldflags").Output()
	if err != nil {
		t.Fatalf("make version-ldflags: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "printversion")
	build := exec.Command("go", "build", "-ldflags="+strings.TrimSpace(string(flags)), "-o", bin, "./testdata/printversion")
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with the Makefile's flags: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	// The commit make read: HEAD may have moved on since (commits in this checkout).
	m := regexp.MustCompile(`stampRevision=([0-9a-f]{40}) `).FindSubmatch(flags)
	if m == nil {
		t.Fatalf("make version-ldflags sets no commit: %s", flags)
	}
	if !strings.Contains(string(out), "revision: "+string(m[1])) {
		t.Errorf("a build with the Makefile's flags under -buildvcs=false does not name its commit %s:\n%s", m[1], out)
	}
	if !strings.Contains(string(out), "time:     20") {
		t.Errorf("a build with the Makefile's flags lacks the commit's time:\n%s", out)
	}
}
