package raftnode

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
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
