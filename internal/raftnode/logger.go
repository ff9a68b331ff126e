package raftnode

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// electionStarted is what raft warns when a follower stops hearing from a
// leader. A node that is a cluster of one hears from no leader at every
// start, and elects itself after one heartbeat timeout: there the message
// is the start going as it should, not a fault.
const electionStarted = "heartbeat timeout reached, starting election"

// logNotFound is what raft logs as an error when an entry it reads is not
// in the log store. A leader replicating to a follower that lacks entries
// the leader has compacted into a snapshot (a node just added, or every
// follower of a cluster restored from a backup, whose log starts after the
// snapshot) reads them, gets raft.ErrLogNotFound, and sends the snapshot
// instead (replication.go: setupAppendEntries, then SEND_SNAP): the normal
// way a new member catches up, not a fault. raft's other readers that log
// this message (NewRaft, processLogs) panic right after with the same
// error, which the panic shows; so the message with exactly that error is
// logged at debug.
const logNotFound = "failed to get log"

// newRaftLogger returns the hclog.Logger that raft writes to. It passes
// raft's messages to l, at the level raft gave them, with their key-value
// pairs as attributes; single is true for a node without a Raft listener.
func newRaftLogger(l *slog.Logger, single bool) hclog.Logger {
	// The intercepting logger's own output is off: every message goes to
	// the sink, which knows its level and arguments, instead of being
	// formatted into a line whose level would have to be parsed back.
	il := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "raft", Level: hclog.Off, Output: io.Discard})
	if l != nil {
		il.RegisterSink(slogSink{l: l, single: single})
	}
	return il
}

// slogSink is an hclog.SinkAdapter writing to a slog.Logger. hclog calls
// it under the intercepting logger's lock.
type slogSink struct {
	l      *slog.Logger
	single bool
}

func (s slogSink) Accept(name string, level hclog.Level, msg string, args ...any) {
	lv, ok := slogLevel(level)
	if !ok {
		return
	}
	if (s.single && msg == electionStarted) || (msg == logNotFound && hasArg(args, "error", raft.ErrLogNotFound)) {
		lv = slog.LevelDebug
	}
	ctx := context.Background()
	if !s.l.Enabled(ctx, lv) {
		return
	}
	for i, a := range args {
		// hclog.Fmt values are a format and its operands, formatted
		// by hclog's own writer: format them here.
		if f, ok := a.(hclog.Format); ok && len(f) > 0 {
			if format, ok := f[0].(string); ok {
				args[i] = fmt.Sprintf(format, f[1:]...)
			}
		}
	}
	s.l.Log(ctx, lv, msg, append(args, "component", name)...)
}

// hasArg reports whether the key-value pairs args hold key with value v
// (compared with ==, as raft compares its sentinel errors).
func hasArg(args []any, key string, v any) bool {
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok && k == key && args[i+1] == v {
			return true
		}
	}
	return false
}

// slogLevel maps raft's levels to slog's. Raft's info messages (state
// changes, snapshot progress) become debug: fenced reports at info what an
// operator needs of them ("leader ready", "lost leadership") in its own
// words. Raft's debug and trace messages are dropped.
func slogLevel(l hclog.Level) (slog.Level, bool) {
	switch l {
	case hclog.Error:
		return slog.LevelError, true
	case hclog.Warn:
		return slog.LevelWarn, true
	case hclog.Info:
		return slog.LevelDebug, true
	}
	return 0, false
}
