// Package version says which build of fence is running, from what the go
// command records in every binary it builds (runtime/debug.ReadBuildInfo):
// the main module's version, the commit it was built from and whether the
// checkout had uncommitted changes, and the Go release. fenced, fencectl
// and fencecheck print it for --version; fenced also shows it on its
// status page, in /metrics (fence_build_info) and to ClusterService.Status.
//
// `go install github.com/fence-dev/fence/cmd/fenced@v1.2.3` records the
// version v1.2.3; `go build` in a git checkout records the commit and a
// pseudo-version derived from it. `go run` and `go test` record no commit,
// and their version is "(devel)".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

// Devel is the module version of a build that recorded none: go run, go
// test, or a build outside a module.
const Devel = "(devel)"

// Info describes one build.
type Info struct {
	Module    string    // the main module's path
	Version   string    // the main module's version, or Devel
	Revision  string    // vcs.revision: the commit built, empty when unknown
	Time      time.Time // vcs.time: when that commit was made; zero when unknown
	Modified  bool      // vcs.modified: the checkout had uncommitted changes
	GoVersion string    // the Go release that built it, e.g. go1.26.8
}

// Get returns the running binary's build. It is safe for concurrent use.
func Get() Info { return get() }

var get = sync.OnceValue(func() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: Devel, GoVersion: runtime.Version()}
	}
	return FromBuildInfo(bi)
})

// FromBuildInfo reads a build from the go command's record of it.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Module: bi.Main.Path, Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if in.Version == "" {
		in.Version = Devel
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time, _ = time.Parse(time.RFC3339, s.Value)
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// Short is the build in one word, for a table's column or a metric's
// label: the module version, or for a build that recorded none but a
// commit, "(devel)-" and the commit's first 12 hex digits ("+dirty" when
// modified). A pseudo-version already names its commit.
func (in Info) Short() string {
	if in.Version != Devel || in.Revision == "" {
		return in.Version
	}
	s := in.Version + "-" + shortRevision(in.Revision)
	if in.Modified {
		s += "+dirty"
	}
	return s
}

// String is the build for people, the answer to --version of the command
// named cmd: its version on the first line, then the commit, its time, and
// the Go release and platform.
func (in Info) String() string { return in.Text("") }

// Text is String with the command's name first.
func (in Info) Text(cmd string) string {
	var b strings.Builder
	if cmd != "" {
		b.WriteString(cmd + " ")
	}
	b.WriteString(in.Version + "\n")
	if in.Module != "" {
		fmt.Fprintf(&b, "module:   %s\n", in.Module)
	}
	rev := in.Revision
	switch {
	case rev == "":
		rev = "unknown (not built from a git checkout with go build or go install)"
	case in.Modified:
		rev += " (modified: the checkout had uncommitted changes)"
	}
	fmt.Fprintf(&b, "revision: %s\n", rev)
	if !in.Time.IsZero() {
		fmt.Fprintf(&b, "time:     %s\n", in.Time.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(&b, "go:       %s %s/%s\n", in.GoVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}

func shortRevision(r string) string {
	if len(r) > 12 {
		return r[:12]
	}
	return r
}
