package raftnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// newerEntry is what a build of a later log format could write: this
// build must not apply it, in any way.
var newerEntry = []byte(`{"op":"set_format","format":99}`)

// TestUnknownEntryHalts: the entries before an entry the node does not
// understand are applied, that entry and those after it are not, and the
// node panics with a HaltError that says which entry and why; a malformed
// command of a known kind is still refused as invalid, as every build does.
func TestUnknownEntryHalts(t *testing.T) {
	var logged bytes.Buffer
	n := &Node{cfg: Config{Logger: slog.New(slog.NewTextHandler(&logged, nil))}, state: fsm.New()}
	m := (*machine)(n)
	acquire := func(scope string) []byte {
		return fsm.Command{Op: fsm.OpAcquire, Scope: scope, LeaseID: fence.NewLeaseID(), TTL: time.Second}.Encode()
	}
	out := m.ApplyBatch([]*raft.Log{{Index: 1, Type: raft.LogCommand, Data: []byte(`{"op":"expire","scope":"a"}`)}})
	if r := out[0].(fsm.Result); r.Outcome != fsm.Invalid {
		t.Fatalf("a malformed expire: %v, want invalid", r.Outcome)
	}
	var got any
	func() {
		defer func() { got = recover() }()
		m.ApplyBatch([]*raft.Log{
			{Index: 2, Type: raft.LogCommand, Data: acquire("before")},
			{Index: 3, Type: raft.LogCommand, Data: newerEntry},
			{Index: 4, Type: raft.LogCommand, Data: acquire("after")},
		})
	}()
	h, ok := got.(*HaltError)
	if !ok {
		t.Fatalf("ApplyBatch with an entry of a newer format: recovered %v, want a *HaltError", got)
	}
	if h.Index != 3 || !errors.Is(h, fsm.ErrUnknownEntry) || !strings.Contains(h.Error(), "log entry 3") {
		t.Errorf("halted with %v (index %d), want entry 3 and ErrUnknownEntry", h, h.Index)
	}
	if !strings.Contains(logged.String(), "level=ERROR") || !strings.Contains(logged.String(), "index=3") {
		t.Errorf("the node logged %q, want an error naming entry 3", logged.String())
	}
	// Not locked: the state can be read, and shows where it stopped.
	n.Read(func(st *fsm.State) {
		if st.Get("before").Lease == nil || st.Get("after").Last != 0 || st.Format() != 1 {
			t.Errorf("before: %+v, after: %+v, format %d; want only the entry before applied", st.Get("before"), st.Get("after"), st.Format())
		}
	})
}

// TestRestoreRefusesNewerFormat: a snapshot of a log format this build
// does not know is refused, and the state kept, rather than restored in
// part.
func TestRestoreRefusesNewerFormat(t *testing.T) {
	n := &Node{state: fsm.New()}
	before := n.state
	body := `{"scopes":[],"format":99}`
	snap := fmt.Sprintf("fence-fsm-snapshot v1 crc32c=%08x\n%s", crc32.Checksum([]byte(body), crc32.MakeTable(crc32.Castagnoli)), body)
	err := (*machine)(n).Restore(io.NopCloser(strings.NewReader(snap)))
	if !errors.Is(err, fsm.ErrUnknownEntry) || n.state != before {
		t.Fatalf("Restore of a snapshot of format 99: %v (state replaced: %v), want ErrUnknownEntry and the state kept", err, n.state != before)
	}
}

// TestUnknownEntryStopsTheProcess writes an entry of a newer format into a
// node's log, in a process of its own: the process stops, saying why, and
// stops again at the same entry when it restarts, rather than skip it.
func TestUnknownEntryStopsTheProcess(t *testing.T) {
	if os.Getenv("RAFTNODE_HALT_DIR") != "" {
		haltChild()
		return
	}
	dir := t.TempDir()
	for _, mode := range []string{"write", "restart"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUnknownEntryStopsTheProcess$")
		cmd.Env = append(os.Environ(), "RAFTNODE_HALT_DIR="+dir, "RAFTNODE_HALT_MODE="+mode)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("%s: the node's process ended with %v, want it stopped; output:\n%s", mode, err, stderr.String())
		}
		out := stderr.String()
		for _, want := range []string{"stopped before log entry", "does not understand", "log format is raised to 99"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: the output does not say %q:\n%s", mode, want, out)
			}
		}
	}
}

// haltChild is the node's process of TestUnknownEntryStopsTheProcess.
func haltChild() {
	n, err := Open(Config{NodeID: "n1", DataDir: os.Getenv("RAFTNODE_HALT_DIR"), Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		os.Stderr.WriteString("open: " + err.Error())
		os.Exit(0)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !n.IsLeader() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if os.Getenv("RAFTNODE_HALT_MODE") == "write" {
		if _, err := n.Apply(context.Background(), fsm.Command{Op: fsm.OpAcquire, Scope: "a", LeaseID: fence.NewLeaseID(), TTL: time.Second}); err != nil {
			os.Stderr.WriteString("acquire: " + err.Error())
			os.Exit(0)
		}
		n.raft.Apply(newerEntry, 5*time.Second)
	}
	time.Sleep(20 * time.Second)
	os.Stderr.WriteString("the node went on for 20s")
	os.Exit(0) // the parent wants a stop, and sees none
}

// TestProbeFormat asks a node of this build and a Raft transport of a build
// from before the probe which log formats they know.
func TestProbeFormat(t *testing.T) {
	dir := t.TempDir()
	n, err := Open(Config{NodeID: "n1", DataDir: dir, RaftListen: "127.0.0.1:0", Bootstrap: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if got, err := n.layer.probeFormat(raft.ServerAddress(n.RaftAddr())); err != nil || got != fsm.LogFormat {
		t.Errorf("probe of this build: %d, %v; want %d", got, err, fsm.LogFormat)
	}

	// raft's own TCP transport, which the builds before the probe used
	// through a layer that did not look at it.
	old, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if got, err := n.layer.probeFormat(old.LocalAddr()); err != nil || got != 1 {
		t.Errorf("probe of an older build: %d, %v; want 1", got, err)
	}

	// A lone node raised its format at once; an older build is refused
	// as a voter, and counts as behind.
	deadline := time.Now().Add(20 * time.Second)
	for n.Format() != fsm.LogFormat {
		if time.Now().After(deadline) {
			t.Fatalf("log format %d after 20s, want %d", n.Format(), fsm.LogFormat)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = n.AddVoter(ctx, "old", string(old.LocalAddr()), "127.0.0.1:1")
	if !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "upgrade it first") {
		t.Errorf("adding a voter of an older build: %v, want it refused", err)
	}
	// A node whose build cannot be asked now (cut off, restarting) is not
	// an older build: unavailable, which a join retries, not a refusal
	// that stops the joining node for good. A member already at its
	// address is not asked at all.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	if err := n.knowsFormat("cut-off", gone.Addr().String()); !errors.Is(err, fence.ErrUnavailable) || errors.Is(err, fence.ErrInvalid) {
		t.Errorf("the format probe of a node that cannot be reached: %v, want unavailable", err)
	}
	if !n.isMember("n1", n.RaftAddr()) || n.isMember("n1", gone.Addr().String()) || n.isMember("cut-off", n.RaftAddr()) {
		t.Error("isMember does not match the configuration's ID and address")
	}
	if err := n.raft.AddNonvoter("old", old.LocalAddr(), 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if behind, err := n.membersBehind(); err != nil || behind != "old" {
		t.Errorf("membersBehind with an older build in the configuration: %q, %v; want \"old\"", behind, err)
	}
}

// TestEntriesFollowTheLogFormat: a node writes its entries in JSON until
// the cluster's log format reaches fsm.BinaryFormat, and in binary from
// then on, which builds before it cannot read.
func TestEntriesFollowTheLogFormat(t *testing.T) {
	n := &Node{state: fsm.New()}
	m := (*machine)(n)
	entry := func() []byte {
		return fsm.Command{Op: fsm.OpPromote}.EncodeFor(n.Format())
	}
	for i, f := range []int{fsm.BinaryFormat - 1, fsm.BinaryFormat} {
		m.ApplyBatch([]*raft.Log{{Index: uint64(i + 1), Type: raft.LogCommand, Data: fsm.Command{Op: fsm.OpSetFormat, Format: f}.Encode()}})
		if binary := entry()[0] != '{'; binary != (f >= fsm.BinaryFormat) {
			t.Errorf("at log format %d the node writes %q", f, entry())
		}
	}

	n = open(t, t.TempDir()) // raised to this build's format
	defer n.Close()
	if _, err := n.Apply(context.Background(), fsm.Command{Op: fsm.OpPromote}); err != nil {
		t.Fatal(err)
	}
	logs := storedLogs(t, n)
	l := logs[len(logs)-1]
	if c, err := fsm.DecodeCommand(l.Data); err != nil || c.Op != fsm.OpPromote || l.Data[0] == '{' {
		t.Errorf("the last entry at log format %d: %q (%+v, %v), want a binary promote", n.Format(), l.Data, c, err)
	}
}

// TestRestartedLeaderDoesNotRaiseAgain: a node that leads again after a
// restart has not yet applied the entry that raised the format when it
// takes office; it must not propose (and log) the raise a second time.
func TestRestartedLeaderDoesNotRaiseAgain(t *testing.T) {
	dir := t.TempDir()
	open(t, dir).Close()
	n := open(t, dir)
	defer n.Close()
	if _, err := n.Apply(context.Background(), fsm.Command{Op: fsm.OpPromote}); err != nil {
		t.Fatal(err)
	}
	raises := 0
	for _, l := range storedLogs(t, n) {
		if c, err := fsm.DecodeCommand(l.Data); l.Type == raft.LogCommand && err == nil && c.Op == fsm.OpSetFormat {
			raises++
		}
	}
	if raises != 1 {
		t.Errorf("%d entries raise the log format, want 1", raises)
	}
}

// storedLogs returns the entries n's log store holds, in order.
func storedLogs(t *testing.T, n *Node) []raft.Log {
	t.Helper()
	first, err := n.store.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := n.store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	logs := make([]raft.Log, last-first+1)
	for i := range logs {
		if err := n.store.GetLog(first+uint64(i), &logs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return logs
}

// TestRaiseWaitsForAddVoter: a raise of the log format and the addition of
// a voter are one step each against the other. A voter whose build knows
// the cluster's format, checked for it, is not added after a raise beyond
// what it knows: it would stop at the entry that raised the format. Here
// the raise comes while the leader asks the new voter which formats it
// knows, the window the lone leader's raise at once fell into.
func TestRaiseWaitsForAddVoter(t *testing.T) {
	older := fsm.LogFormat - 1
	peer := listenOlderBuild(t, older)
	warned := make(chan struct{})
	n, err := Open(Config{NodeID: "n1", DataDir: t.TempDir(), RaftListen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(&signalWriter{want: "cannot raise the log format yet", seen: warned}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	// A cluster held below this build's format by a member of an older
	// build: its raise waits probeInterval before it tries again, and
	// meanwhile the member leaves.
	boot := raft.Configuration{Servers: []raft.Server{
		{ID: "n1", Address: raft.ServerAddress(n.RaftAddr()), Suffrage: raft.Voter},
		{ID: "older", Address: peer.addr(), Suffrage: raft.Nonvoter},
	}}
	if err := n.raft.BootstrapCluster(boot).Error(); err != nil {
		t.Fatal(err)
	}
	<-warned
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := n.Apply(ctx, fsm.Command{Op: fsm.OpSetFormat, Format: older}); err != nil {
		t.Fatal(err)
	}
	if err := n.raft.RemoveServer("older", 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if n.Format() != older {
		t.Fatalf("log format %d, want %d", n.Format(), older)
	}

	// While the leader asks the new voter, a raise comes, and gives up
	// after a second if it has to wait.
	raised := make(chan error, 1)
	peer.beforeAnswer(func() {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		defer rcancel()
		raised <- n.RaiseFormat(rctx)
	})
	added := n.AddVoter(ctx, "old", string(peer.addr()), "127.0.0.1:1")
	t.Logf("AddVoter: %v; the raise meanwhile: %v", added, <-raised)
	if n.isMember("old", string(peer.addr())) && n.Format() > older {
		t.Fatalf("a voter whose build knows log formats 1 to %d was added to a cluster of log format %d", older, n.Format())
	}
	if err := n.RaiseFormat(ctx); err == nil || !strings.Contains(err.Error(), `member old runs a build older`) {
		t.Errorf("a raise with the older build a member: %v, want it refused", err)
	}
}

// olderBuild is the Raft address of a node whose build knows log formats
// 1 to format: it answers format probes, and ends every other connection.
type olderBuild struct {
	ln     net.Listener
	format int
	hook   atomic.Pointer[func()] // called once before the next answer
}

func listenOlderBuild(t testing.TB, format int) *olderBuild {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &olderBuild{ln: ln, format: format}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go b.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return b
}

func (b *olderBuild) addr() raft.ServerAddress { return raft.ServerAddress(b.ln.Addr().String()) }

// beforeAnswer makes f run before the next probe is answered.
func (b *olderBuild) beforeAnswer(f func()) { b.hook.Store(&f) }

func (b *olderBuild) serve(c net.Conn) {
	defer c.Close()
	var first [1]byte
	if _, err := c.Read(first[:]); err != nil || first[0] != probeByte {
		return
	}
	if f := b.hook.Swap(nil); f != nil {
		(*f)()
	}
	c.Write([]byte{probeByte, byte(b.format)})
}

// signalWriter closes seen the first time a write contains want.
type signalWriter struct {
	want string
	seen chan struct{}
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}
