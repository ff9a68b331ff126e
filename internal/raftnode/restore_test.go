package raftnode

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// backupHolding returns a backup, as `fencectl backup` writes one, of a
// state in which scope is held, and the token it is held with.
func backupHolding(t *testing.T, scope string) ([]byte, uint64) {
	t.Helper()
	st := fsm.New()
	r := st.Apply(fsm.Command{Op: fsm.OpAcquire, Scope: scope, Holder: "h", LeaseID: fence.NewLeaseID(), TTL: time.Minute, At: time.Now().UnixNano()})
	if r.Outcome != fsm.Granted {
		t.Fatalf("acquire %s: %+v", scope, r)
	}
	var b bytes.Buffer
	if _, err := st.Freeze().WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), r.Lease.Token
}

// openRestored opens a node on dir restored from the backup at path, and
// waits for it to lead and catch up.
func openRestored(t *testing.T, dir, path string) (*Node, error) {
	t.Helper()
	n, err := Open(Config{NodeID: "n1", DataDir: dir, Restore: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { n.Close() })
	for deadline := time.Now().Add(20 * time.Second); !n.IsLeader(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader 20s after the restore")
		}
	}
	return n, nil
}

// wantHeld checks that n's state holds scope with token.
func wantHeld(t *testing.T, n *Node, scope string, token uint64) {
	t.Helper()
	var in fsm.ScopeInfo
	n.Read(func(st *fsm.State) { in = st.Get(scope) })
	if in.Lease == nil || in.Lease.Token != token {
		t.Fatalf("%s after the restore: %+v; want held with token %d", scope, in, token)
	}
}

// TestRestoreRefusesADamagedBackup: a damaged backup is refused, saying
// what is wrong with which file, and leaves no snapshot and no Raft state:
// the same directory then restores a good backup.
func TestRestoreRefusesADamagedBackup(t *testing.T) {
	good, token := backupHolding(t, "orders")
	files := t.TempDir()
	goodPath, damagedPath := filepath.Join(files, "good.backup"), filepath.Join(files, "damaged.backup")
	damaged := bytes.Clone(good)
	damaged[len(damaged)/2] ^= 0x5a
	for path, b := range map[string][]byte{goodPath: good, damagedPath: damaged} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	_, err := openRestored(t, dir, damagedPath)
	if err == nil || !strings.Contains(err.Error(), "restore "+damagedPath) || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("restore of a damaged backup: %v; want refused, naming the file and the checksum", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*")); len(left) != 0 {
		t.Fatalf("the refused restore left %v", left)
	}
	n, err := openRestored(t, dir, goodPath)
	if err != nil {
		t.Fatalf("restore of the good backup after the refusal: %v", err)
	}
	wantHeld(t, n, "orders", token)
}

// TestRestoreReadsTheBackupOnce: the backup is read once, and what was
// checked is what is restored. Here it is a pipe, which gives its bytes to
// its first reader only, as a file that changed after the check: a restore
// that checked one read and copied from a second kept an empty snapshot,
// unchecked, and the node could not start from it.
func TestRestoreReadsTheBackupOnce(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("opening a pipe by path needs /proc/self/fd (Linux)")
	}
	good, token := backupHolding(t, "orders")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Small enough for the pipe's buffer: written whole before the read.
	if _, err := w.Write(good); err != nil {
		t.Fatal(err)
	}
	w.Close()
	n, err := openRestored(t, t.TempDir(), fmt.Sprintf("/proc/self/fd/%d", r.Fd()))
	if err != nil {
		t.Fatalf("restore from a pipe: %v", err)
	}
	wantHeld(t, n, "orders", token)
}
