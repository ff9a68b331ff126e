//go:build unix

package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// eventOutput is a line of watch -o json: the API's WatchEvent.
type eventOutput = *fencev1.WatchEvent

// watcher is a running "fencectl watch" whose output is read line by line.
type watcher struct {
	lines *bufio.Scanner
	wait  func() error
}

func (s *fenced) watch(t *testing.T, args ...string) *watcher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cmd := s.command(ctx, append([]string{"watch"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &watcher{lines: bufio.NewScanner(out), wait: cmd.Wait}
}

func (w *watcher) line(t *testing.T) string {
	t.Helper()
	if !w.lines.Scan() {
		t.Fatalf("watch output ended: %v", w.lines.Err())
	}
	return w.lines.Text()
}

func (w *watcher) event(t *testing.T) eventOutput {
	t.Helper()
	line := w.line(t)
	e := new(fencev1.WatchEvent)
	if err := protojson.Unmarshal([]byte(line), e); err != nil {
		t.Fatalf("decode %q: %v", line, err)
	}
	return e
}

// TestWatch: watch prints the leases held when it starts, then each event
// live, one JSON object per line, and exits after --count events.
func TestWatch(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	floor := s.floor(t)
	var a leaseOutput
	s.wantJSON(t, 0, &a, "acquire", "orders/a", "--holder", "alice", "--ttl", "30s")
	w := s.watch(t, "orders/", "--held", "--count", "4", "-o", "json")
	if e := w.event(t); e.Kind != fencev1.EventKind_EVENT_KIND_HELD || e.Scope != "orders/a" || e.Token != a.Token || e.Holder != "alice" || e.LeaseIdPrefix != mustLeaseID(t, a.LeaseID).Fingerprint() {
		t.Fatalf("first line = %+v, want orders/a held by alice", e)
	}
	s.want(t, 0, "release", "orders/a", "--lease", a.LeaseID)
	var b leaseOutput
	s.wantJSON(t, 0, &b, "acquire", "orders/b", "--holder", "bob", "--ttl", "100ms")
	var last uint64
	for i, want := range []struct {
		kind  fencev1.EventKind
		scope string
	}{{fencev1.EventKind_EVENT_KIND_RELEASED, "orders/a"}, {fencev1.EventKind_EVENT_KIND_GRANTED, "orders/b"}, {fencev1.EventKind_EVENT_KIND_EXPIRED, "orders/b"}} {
		e := w.event(t)
		token := floor + 1 // each scope's first grant
		if e.Kind != want.kind || e.Scope != want.scope || e.Token != token || e.Position <= last || e.Time == nil {
			t.Fatalf("line %d = %+v, want %s %s with token %d", i+2, e, want.scope, want.kind, token)
		}
		last = e.Position
	}
	if err := w.wait(); err != nil {
		t.Fatalf("watch --count 4 after 4 events: %v", err)
	}
}

// TestWatchText: the text form names the kind, scope, token and holder.
func TestWatchText(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	floor := s.floor(t)
	s.want(t, 0, "acquire", "jobs/x", "--holder", "zed")
	w := s.watch(t, "jobs/", "--held", "--count", "2")
	if line := w.line(t); !strings.Contains(line, fmt.Sprintf(`held      jobs/x  token %d  holder "zed"`, floor+1)) {
		t.Fatalf("held line = %q", line)
	}
	s.want(t, 0, "acquire", "jobs/y", "--holder", "amy")
	if line := w.line(t); !strings.Contains(line, fmt.Sprintf(`granted   jobs/y  token %d  holder "amy"`, floor+1)) || !strings.Contains(line, "position ") {
		t.Fatalf("granted line = %q", line)
	}
	if err := w.wait(); err != nil {
		t.Fatal(err)
	}
}

// TestWatchMissed: resuming from a position the service does not keep
// fails with code missed_events.
func TestWatchMissed(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	s.want(t, 0, "acquire", "a")
	var out errorOutput
	s.wantJSON(t, 1, &out, "watch", "--from", "1")
	if out.Code != "missed_events" || !strings.Contains(out.Error, "not retained") {
		t.Fatalf("watch --from 1: %+v", out)
	}
}

// mustLeaseID parses a lease ID that fencectl printed.
func mustLeaseID(t *testing.T, s string) fence.LeaseID {
	t.Helper()
	id, err := fence.ParseLeaseID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
