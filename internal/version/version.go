// Package version says which build of fence is running, from what the go
// command records in every binary it builds (runtime/debug.ReadBuildInfo):
// the main module's version, the commit it was built from and whether the
// checkout had uncommitted changes, and the Go release. fenced, fencectl
// and fencecheck print it for --version; fenced also shows it on its
// status page, in /metrics (fence_build_info) and to ClusterService.Status.
//
// `go install github.com/fence-dev/fence/cmd/fenced@v1.2.3` records the
// version v1.2.3; `go build` in a git checkout records the commit and a
// pseudo-version derived from it, unless -buildvcs=false (which GOFLAGS
// may hold) turns that off. `go run` and `go test` record no commit, and
// their version is "(devel)".
//
// So the Makefile's builds do not depend on that: they also set the
// commit, its time, whether the checkout was modified and the tag git
// describes through the linker (-ldflags -X, see the Makefile's
// VERSION_LDFLAGS), into the variables below, which take precedence over
// what the go command recorded.
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

// Set with -ldflags "-X github.com/fence-dev/fence/internal/version.NAME=VALUE"
// by the Makefile; empty in other builds.
var (
	stampRevision string // git rev-parse HEAD
	stampTime     string // git show -s --format=%cI HEAD (RFC 3339)
	stampModified string // "true" when the checkout had uncommitted changes
	stampVersion  string // git describe --tags: empty without a tag
)

// Get returns the running binary's build. It is safe for concurrent use.
func Get() Info { return get() }

var get = sync.OnceValue(func() Info {
	in := Info{Version: Devel, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		in = FromBuildInfo(bi)
	}
	return in.Stamped(stampVersion, stampRevision, stampTime, stampModified)
})

// Stamped returns in with what the Makefile's build set through the
// linker: the commit, its time (RFC 3339), "true" if the checkout was
// modified, and the version git describes. A stamp that is empty leaves
// in's field as it is; a revision set replaces the commit, its time and
// modified all three. A modified checkout's version gets "+dirty", as a
// go command's pseudo-version does.
func (in Info) Stamped(version, revision, commitTime, modified string) Info {
	if revision != "" {
		in.Revision = revision
		in.Time, _ = time.Parse(time.RFC3339, commitTime)
		in.Modified = modified == "true"
	}
	if version != "" {
		in.Version = version
		if in.Modified && !strings.HasSuffix(version, "+dirty") {
			in.Version += "+dirty"
		}
	}
	return in
}

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
		rev = "unknown (the build recorded no commit: go run, go test, -buildvcs=false in GOFLAGS, or not a git checkout; make build records it)"
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
