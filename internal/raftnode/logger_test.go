package raftnode

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// TestSingleNodeStartsQuietly opens a node that is a cluster of one and
// reads everything it logged, debug included, until it led: its start
// elects itself, which is no fault, so nothing is a warning or an error,
// and raft's election message is there at debug.
func TestSingleNodeStartsQuietly(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n, err := Open(Config{NodeID: "n1", DataDir: t.TempDir(), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !n.IsLeader() {
		if time.Now().After(deadline) {
			n.Close()
			t.Fatal("no leader after 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	log := buf.String()
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("a clean start of a single node logged %s", line)
		}
	}
	if !strings.Contains(log, `level=DEBUG msg="`+electionStarted+`"`) {
		t.Errorf("raft's election message is not logged at debug:\n%s", log)
	}
}

// TestRaftLogLevels feeds raft's levels through the sink: warnings and
// errors keep their level, info becomes debug, debug and trace are
// dropped, and the election message is a warning in a cluster (where it
// means a leader went quiet) and debug only in a cluster of one.
func TestRaftLogLevels(t *testing.T) {
	for _, tc := range []struct {
		single bool
		level  hclog.Level
		msg    string
		want   string // the line's level, "" for no line
	}{
		{false, hclog.Warn, electionStarted, "WARN"},
		{true, hclog.Warn, electionStarted, "DEBUG"},
		{true, hclog.Warn, "failed to contact", "WARN"},
		{true, hclog.Error, "failed to take snapshot", "ERROR"},
		{false, hclog.Info, "entering leader state", "DEBUG"},
		{false, hclog.Debug, "votes", ""},
		{false, hclog.Trace, "append", ""},
	} {
		var buf bytes.Buffer
		l := newRaftLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), tc.single)
		l.Log(tc.level, tc.msg, "term", 2, "servers", hclog.Fmt("%d voters", 3))
		got := buf.String()
		if tc.want == "" {
			if got != "" {
				t.Errorf("single=%v %v %q: logged %s, want nothing", tc.single, tc.level, tc.msg, got)
			}
			continue
		}
		want := "level=" + tc.want + ` msg="` + tc.msg + `" term=2 servers="3 voters" component=raft`
		if !strings.Contains(got, want) {
			t.Errorf("single=%v %v %q: logged %q, want %q", tc.single, tc.level, tc.msg, got, want)
		}
	}
}

// TestLogNotFoundIsDebug: raft's "failed to get log" with
// raft.ErrLogNotFound, which a leader logs before it sends a follower the
// snapshot instead (every join of a cluster restored from a backup), is
// debug; the same message with any other error stays an error.
func TestLogNotFoundIsDebug(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{raft.ErrLogNotFound, `level=DEBUG msg="failed to get log" index=1 error="log not found" component=raft`},
		{errors.New("log not found"), `level=ERROR msg="failed to get log" index=1 error="log not found" component=raft`},
		{errors.New("checksum mismatch"), `level=ERROR msg="failed to get log" index=1 error="checksum mismatch" component=raft`},
	} {
		var buf bytes.Buffer
		l := newRaftLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), false)
		l.Error("failed to get log", "index", 1, "error", tc.err)
		if got := buf.String(); !strings.Contains(got, tc.want) {
			t.Errorf("raft logged failed to get log with %#v: %q, want %q", tc.err, got, tc.want)
		}
	}
	// Another message with that error keeps its level.
	var buf bytes.Buffer
	newRaftLogger(slog.New(slog.NewTextHandler(&buf, nil)), false).Error("failed to appendEntries to", "error", raft.ErrLogNotFound)
	if !strings.Contains(buf.String(), "level=ERROR") {
		t.Errorf("another message with raft.ErrLogNotFound: %q, want an error", buf.String())
	}
}
