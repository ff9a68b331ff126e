package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
)

// TestDataDirInUse: a second fenced on a data directory in use fails at
// once, naming the process that holds it, where it used to wait for ever
// on bbolt's lock, silent and deaf to SIGTERM. Once the first has stopped
// the directory is free again.
func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	first := startFenced(t, dir, freeAddr(t))
	second := spawn(t, dir, freeAddr(t))
	select {
	case <-second.exit:
	case <-time.After(15 * time.Second):
		t.Fatal("a second fenced on a data directory in use still runs after 15s")
	}
	if code := second.cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("the second fenced exited with status 0")
	}
	log, _ := os.ReadFile(second.log)
	want := "is in use by process " + strconv.Itoa(first.cmd.Process.Pid)
	if !strings.Contains(string(log), want) {
		t.Errorf("the second fenced's log does not say %q:\n%s", want, log)
	}
	first.stop(t)
	startFenced(t, dir, freeAddr(t)).stop(t)
}

// mountTmpfs mounts a tmpfs of the given size (mount's size= option) for
// the test, and unmounts it at its end.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a full disk is tested on a tmpfs of its own, which only root may mount")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); a full disk is not tested", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file into dir's file system until only leave bytes are
// free, and returns its path.
func fill(t *testing.T, dir string, leave uint64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := st.Bavail * uint64(st.Bsize)
	path := filepath.Join(dir, "filler")
	if free <= leave {
		return path
	}
	if err := os.WriteFile(path, make([]byte, free-leave), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// cycle acquires and releases scope once, and returns the token. Its
// lease lasts 2s, so that one a fault brings back unreleased (a lost
// release, a flipped lease ID) ends soon after a restart.
func cycle(ctx context.Context, c *client.Client, scope string) (uint64, error) {
	l, err := c.Grant(ctx, scope, client.WithTTL(2*time.Second))
	if err != nil {
		return 0, err
	}
	_, err = c.Release(ctx, scope, l.ID)
	return l.Token, err
}

// TestDiskNearlyFull: below --min-free-space the leader refuses new
// grants with Unavailable, saying the disk is nearly full, and /readyz
// says so; once space is freed it grants again, above every earlier token.
func TestDiskNearlyFull(t *testing.T) {
	dir := mountTmpfs(t, "16m")
	addr := freeAddr(t)
	startFenced(t, dir, addr, "--raft-segment-size", "1048576")
	c := newClient(t, addr, client.WithRetryTimeout(0))
	ctx := context.Background()
	before, err := cycle(ctx, c, "disk")
	if err != nil {
		t.Fatal(err)
	}
	filler := fill(t, dir, 1<<20) // below the default: two 1 MiB segments
	var refused error
	for deadline := time.Now().Add(10 * time.Second); refused == nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, refused = cycle(ctx, c, "disk")
	}
	if !errors.Is(refused, fence.ErrUnavailable) || !strings.Contains(refused.Error(), "disk nearly full in "+dir) {
		t.Fatalf("acquire on a nearly full disk: %v; want unavailable, disk nearly full in %s", refused, dir)
	}
	code, body := getURL(t, "http://"+addr+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "disk nearly full") {
		t.Errorf("/readyz on a nearly full disk: %d %q", code, body)
	}
	if _, body := getURL(t, "http://"+addr+"/metrics"); !strings.Contains(body, "fence_data_dir_free_bytes") {
		t.Errorf("/metrics has no fence_data_dir_free_bytes")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var after uint64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if after, err = cycle(ctx, c, "disk"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || after <= before {
		t.Fatalf("after space was freed: token %d, %v; want a grant above %d", after, err, before)
	}
}

// TestDiskFullStopsAtOnce: a log write that finds the disk full (here the
// rollover to a new 1 MiB raft-wal segment, with the early refusal turned
// off) stops fenced at once with a message that names the data directory,
// where it used to loop on "segment is sealed" until restarted, or for
// ever once a snapshot had recorded the broken tail. Started again once
// space is freed, it serves every acknowledged grant and issues no token
// twice.
func TestDiskFullStopsAtOnce(t *testing.T) {
	dir := mountTmpfs(t, "16m")
	addr := freeAddr(t)
	args := []string{"--raft-segment-size", "1048576", "--min-free-space", "1", "--snapshot-threshold", "1000000"}
	p := startFenced(t, dir, addr, args...)
	filler := fill(t, dir, 3<<19) // the segment in use and half of the next
	c := newClient(t, addr, client.WithRetryTimeout(0))
	ctx := context.Background()
	acked := map[uint64]bool{}
	var highest uint64
	stopped := false
	for i := 0; i < 50_000 && !stopped; i++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := c.Grant(cctx, "disk", client.WithTTL(time.Minute))
		cancel()
		if err == nil {
			acked[l.Token], highest = true, max(highest, l.Token)
			c.Release(ctx, "disk", l.ID)
		}
		select {
		case <-p.exit:
			stopped = true
		default:
		}
	}
	if !stopped {
		select {
		case <-p.exit:
		case <-time.After(10 * time.Second):
			log, _ := os.ReadFile(p.log)
			t.Fatalf("fenced still runs on a full disk after %d grants:\n%s", len(acked), tail(log, 3000))
		}
	}
	log, _ := os.ReadFile(p.log)
	if !strings.Contains(string(log), "cannot append to the Raft log in "+dir) {
		t.Fatalf("fenced stopped without naming the full data directory:\n%s", tail(log, 3000))
	}
	if strings.Contains(string(log), "failed to commit logs") {
		t.Errorf("fenced went on writing after the failed rollover:\n%s", tail(log, 3000))
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	startFenced(t, dir, addr, args...)
	c2 := newClient(t, addr, client.WithRetryTimeout(10*time.Second))
	for range 20 {
		tok, err := cycle(ctx, c2, "disk")
		if err != nil {
			t.Fatal(err)
		}
		if acked[tok] || tok <= highest {
			t.Fatalf("after the restart: token %d, acknowledged before (highest %d)", tok, highest)
		}
	}
	t.Logf("%d grants acknowledged before the disk filled", len(acked))
}

func getURL(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// tail returns the last n bytes of b.
func tail(b []byte, n int) []byte { return b[max(len(b)-n, 0):] }

// history is a data directory fenced wrote, with every token it
// acknowledged in it.
type history struct {
	dir     string
	args    []string
	acked   map[uint64]bool
	highest uint64
}

// historyScopes are the scopes a history's grants take turns on.
var historyScopes = []string{"s/0", "s/1", "s/2", "s/3"}

// writeHistory runs fenced with args on a new data directory, acquires and
// releases grants times, and stops it with SIGTERM.
func writeHistory(t *testing.T, grants int, args ...string) *history {
	t.Helper()
	h := &history{dir: t.TempDir(), args: args, acked: map[uint64]bool{}}
	p := startFenced(t, h.dir, freeAddr(t), args...)
	h.grant(t, p.addr, grants)
	p.stop(t)
	return h
}

// grant acquires and releases n times at addr, recording every token.
func (h *history) grant(t *testing.T, addr string, n int) {
	t.Helper()
	c := newClient(t, addr, client.WithRetryTimeout(10*time.Second))
	for i := range n {
		tok, err := cycle(context.Background(), c, historyScopes[i%len(historyScopes)])
		if err != nil {
			t.Fatal(err)
		}
		h.acked[tok], h.highest = true, max(h.highest, tok)
	}
}

// copyDir copies a data directory as an operator's backup would (cp -a).
func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	return to
}

// startAfterFault starts fenced on dir, a copy of h's data directory that
// a fault changed. It must either refuse to start, naming dir in what it
// says, or serve with every new token above every token h acknowledged.
// It returns what fenced said when it refused, "" when it served.
func (h *history) startAfterFault(t *testing.T, dir string) string {
	t.Helper()
	addr := freeAddr(t)
	p := spawn(t, dir, addr, h.args...)
	c := newClient(t, addr, client.WithRetryTimeout(0))
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, "probe")
		cancel()
		if err == nil {
			break
		}
		select {
		case <-p.exit:
			log, _ := os.ReadFile(p.log)
			if p.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(string(log), dir) {
				t.Fatalf("fenced stopped (%v) without naming the data directory %s; its log (%d bytes) ends:\n%s", p.cmd.ProcessState, dir, len(log), tail(log, 4000))
			}
			return string(log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(p.log)
			t.Fatalf("fenced neither serves nor stops 20s after the fault:\n%s", tail(log, 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.checkAbove(t, newClient(t, addr, client.WithRetryTimeout(10*time.Second)), p.log)
	p.stop(t)
	return ""
}

// lost is what fenced says when its log ends below an index it applied.
const lost = "entries it acknowledged were lost"

// checkAbove grants each of the history's scopes twice through c, waiting
// in line where a lease holds it (one the history left held, or one a
// fault brought back, a lost release or a flipped lease ID, holds its
// scope until its TTL runs out on the new leader), and checks that every
// token is above every token the history acknowledged. log is the
// process's log, shown when a grant fails.
func (h *history) checkAbove(t *testing.T, c *client.Client, log string) {
	t.Helper()
	for i := range 2 * len(historyScopes) {
		scope := historyScopes[i%len(historyScopes)]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		l, err := c.Grant(ctx, scope, client.WithTTL(time.Minute), client.WithWait())
		cancel()
		if err != nil {
			b, _ := os.ReadFile(log)
			t.Fatalf("grant %s: %v\n%s", scope, err, tail(b, 4000))
		}
		if h.acked[l.Token] || l.Token <= h.highest {
			t.Fatalf("%s granted token %d; up to %d was acknowledged before (issued again: %v)", scope, l.Token, h.highest, h.acked[l.Token])
		}
		if _, err := c.Release(context.Background(), scope, l.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// walFiles returns the raft-wal segment files of dir, oldest first.
func walFiles(t *testing.T, dir string) []string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no raft-wal segment in %s: %v", dir, err)
	}
	return segs // Glob sorts; the names start with the first index, zero-padded
}

// written returns how many bytes of a preallocated segment were written:
// up to its last byte that is not zero.
func written(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := len(b)
	for n > 0 && b[n-1] == 0 {
		n--
	}
	return n
}

func flipByte(t *testing.T, path string, off int64) { xorByte(t, path, off, 0x5a) }

// xorByte changes the byte at off in the file at path by mask.
func xorByte(t *testing.T, path string, off int64, mask byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// historyArgs make small segments and frequent snapshots, so that a short
// history has several segments, snapshots and a compacted log.
var historyArgs = []string{"--raft-segment-size", "65536", "--snapshot-threshold", "1024", "--snapshot-interval", "300ms"}

// TestStorageFaults damages a copy of a data directory fenced wrote and
// stopped cleanly, in each of the ways an outside fault test found, and
// starts fenced on it: it must refuse to start, naming the data directory
// (and, through the message, the next step), or serve with every new token
// above every acknowledged one. Never a token issued twice.
func TestStorageFaults(t *testing.T) {
	h := writeHistory(t, 3000, historyArgs...)
	served, refused := 0, 0
	// run damages a copy with fault and starts fenced on it; a fault
	// that must be detected names what fenced must say.
	run := func(name, mustSay string, fault func(t *testing.T, dir string)) {
		t.Run(name, func(t *testing.T) {
			dir := copyDir(t, h.dir)
			fault(t, dir)
			said := h.startAfterFault(t, dir)
			if said == "" {
				served++
			} else {
				refused++
			}
			if mustSay != "" && !strings.Contains(said, mustSay) {
				t.Errorf("want a refusal saying %q; fenced said %q (nothing: it served)", mustSay, said)
			}
		})
	}
	// Byte flips across the newest segment: frame headers, payloads,
	// lease IDs, scope names, the index block, at offsets spread evenly.
	for i := range 12 {
		run(fmt.Sprintf("flip/%d", i), "", func(t *testing.T, dir string) {
			segs := walFiles(t, dir)
			newest := segs[len(segs)-1]
			n := written(t, newest)
			flipByte(t, newest, int64(i*n/12+rand.IntN(max(n/12, 1))))
		})
	}
	for i := range 3 {
		run(fmt.Sprintf("truncate/%d", i), lost, func(t *testing.T, dir string) {
			segs := walFiles(t, dir)
			newest := segs[len(segs)-1]
			if err := os.Truncate(newest, int64(rand.IntN(written(t, newest)))); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A scope name in an early batch of the newest segment, which raft-wal
	// reads back unchecked: the node served a grant under another scope
	// before fenced checked every batch's CRC at open.
	run("flip-scope-early", "does not match its checksum", func(t *testing.T, dir string) {
		segs := walFiles(t, dir)
		newest := segs[len(segs)-1]
		b, err := os.ReadFile(newest)
		if err != nil {
			t.Fatal(err)
		}
		at := bytes.Index(b[:written(t, newest)/4], []byte(historyScopes[0]))
		if at < 0 {
			t.Fatalf("no %q in the first quarter of %s", historyScopes[0], newest)
		}
		flipByte(t, newest, int64(at))
	})
	run("meta-db-deleted", "", func(t *testing.T, dir string) {
		if err := os.Remove(filepath.Join(dir, "wal", "wal-meta.db")); err != nil {
			t.Fatal(err)
		}
	})
	run("newest-snapshot-corrupt", "is damaged", func(t *testing.T, dir string) {
		snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*", "state.bin"))
		if len(snaps) == 0 {
			t.Fatal("no snapshot was taken")
		}
		newest := snaps[len(snaps)-1] // names start with term and index
		fi, err := os.Stat(newest)
		if err != nil {
			t.Fatal(err)
		}
		flipByte(t, newest, rand.Int64N(fi.Size()))
	})
	run("data-dir-wiped", "", func(t *testing.T, dir string) {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("after %d faults: %d served above every acknowledged token, %d refused to start", served+refused, served, refused)
}

// TestStorageFaultsNoSnapshot: a deleted wal-meta.db, or a truncated or
// damaged newest segment, in a data directory with two segments and no
// snapshot yet.
func TestStorageFaultsNoSnapshot(t *testing.T) {
	h := writeHistory(t, 600, "--raft-segment-size", "65536")
	if len(walFiles(t, h.dir)) < 2 {
		t.Fatalf("the history wrote one segment; the test wants two or more")
	}
	for _, name := range []string{"meta-db-deleted", "truncate", "flip", "flip-configuration"} {
		t.Run(name, func(t *testing.T) {
			dir := copyDir(t, h.dir)
			segs := walFiles(t, dir)
			newest := segs[len(segs)-1]
			switch name {
			case "meta-db-deleted":
				if err := os.Remove(filepath.Join(dir, "wal", "wal-meta.db")); err != nil {
					t.Fatal(err)
				}
			case "truncate":
				if err := os.Truncate(newest, int64(written(t, newest)/2)); err != nil {
					t.Fatal(err)
				}
			case "flip":
				flipByte(t, newest, int64(written(t, newest)/2))
			case "flip-configuration":
				// Inside the first entries of the oldest segment, where the
				// cluster's configuration is: raft panics reading it.
				flipByte(t, segs[0], 72)
			}
			said := h.startAfterFault(t, dir)
			switch {
			case name == "truncate" && !strings.Contains(said, lost):
				t.Errorf("want a refusal saying %q; fenced said: %q", lost, said)
			case (name == "meta-db-deleted" || name == "flip-configuration") && !strings.Contains(said, "restore a backup"):
				t.Errorf("want a refusal that says what to do; fenced said: %q", said)
			}
		})
	}
}

// TestLogDamagedWhileRunning: a byte of the leader's log changes on disk
// after the leader checked the log at start, and a follower that was down
// catches up from that copy: it stores the entry under a CRC of its own,
// so only the checksum the entry was proposed with tells. The follower
// must stop at the entry, saying why, never apply it as a grant of
// another scope, while the leader and the third node go on serving.
func TestLogDamagedWhileRunning(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	leader := c.leader()
	behind := c.others(leader)[0]
	behind.p.kill(t)

	cl := newClient(t, leader.api, client.WithRetryTimeout(10*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 20 {
		if _, err := cl.Grant(ctx, fmt.Sprintf("runtime/%02d", i), client.WithTTL(5*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	// One letter: "runtime/07" reads "buntime/07", a valid scope.
	damaged := false
	for _, seg := range walFiles(t, leader.dataDir) {
		b, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		if at := bytes.Index(b, []byte("runtime/07")); at >= 0 {
			xorByte(t, seg, int64(at), 0x10)
			damaged = true
			break
		}
	}
	if !damaged {
		t.Fatal("no runtime/07 in the leader's log")
	}

	behind.p = spawn(t, behind.dataDir, behind.api, behind.args()...)
	select {
	case <-behind.p.exit:
	case <-time.After(30 * time.Second):
		t.Fatal("the follower went on for 30s after catching up from a damaged entry")
	}
	out, _ := os.ReadFile(behind.p.log)
	if !bytes.Contains(out, []byte("does not match its checksum")) {
		t.Errorf("the follower stopped without saying the entry is damaged:\n%s", tail(out, 2000))
	}
	// The others still serve the scope as granted.
	st, err := cl.Get(ctx, "runtime/07")
	if err != nil || st.Lease == nil {
		t.Errorf("runtime/07 at the leader: %+v, %v; want held", st, err)
	}
}

// TestRestoredCopy: a copy of the data directory, taken cold (stopped) or
// hot (cp -a while fenced grants), and started after the original went on
// granting, grants above every token the original acknowledged, after the
// copy was taken included.
func TestRestoredCopy(t *testing.T) {
	for _, hot := range []bool{false, true} {
		t.Run(map[bool]string{false: "cold", true: "hot"}[hot], func(t *testing.T) {
			h := &history{dir: t.TempDir(), args: historyArgs, acked: map[uint64]bool{}}
			p := startFenced(t, h.dir, freeAddr(t), h.args...)
			h.grant(t, p.addr, 500)
			var backup string
			if hot {
				done := make(chan struct{})
				go func() { defer close(done); backup = copyDir(t, h.dir) }()
				h.grant(t, p.addr, 500)
				<-done
				os.Remove(filepath.Join(backup, "LOCK")) // a hot copy carries the lock file, not the lock
			} else {
				p.stop(t)
				backup = copyDir(t, h.dir)
				p = startFenced(t, h.dir, p.addr, h.args...)
			}
			h.grant(t, p.addr, 1000)
			p.kill(t)
			said := h.startAfterFault(t, backup)
			if said == "" {
				return
			}
			// A hot copy may hold an applied-index record newer than the
			// segments it copied: refused, as a lost tail would be. The
			// operator who restores it on purpose removes the record.
			if !hot || !strings.Contains(said, lost) {
				t.Fatalf("the copy (hot: %v) refused to start:\n%s", hot, said)
			}
			if err := os.Remove(filepath.Join(backup, "applied-index")); err != nil {
				t.Fatal(err)
			}
			if said := h.startAfterFault(t, backup); said != "" {
				t.Fatalf("the hot copy refused to start without its applied-index record:\n%s", said)
			}
		})
	}
}

// TestClusterRestoredFromBackup: all three nodes of a cluster are stopped,
// copied cold, started again and grant on; then every node is put back to
// its copy and the cluster started on the copies. Its next tokens are above
// every token acknowledged, after the backup included.
func TestClusterRestoredFromBackup(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	h := &history{acked: map[uint64]bool{}}
	h.grant(t, c.addrs(), 200)
	backups := map[string]string{}
	for _, nd := range c.nodes {
		nd.p.stop(t)
	}
	for _, nd := range c.nodes {
		backups[nd.id] = copyDir(t, nd.dataDir)
		c.start(nd)
	}
	c.leader()
	h.grant(t, c.addrs(), 400)
	for _, nd := range c.nodes {
		nd.p.kill(t)
		if err := os.RemoveAll(nd.dataDir); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", backups[nd.id], nd.dataDir).CombinedOutput(); err != nil {
			t.Fatalf("cp -a: %v: %s", err, out)
		}
	}
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.leader()
	h.checkAbove(t, newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second)), c.leader().p.log)
}

// TestRestoreFromBackup: --restore starts a new node from a backup (here a
// snapshot's state.bin, as an operator copies it) taken while the service
// went on granting: the leases the backup holds are held again with their
// tokens, and every new token is above every token acknowledged, after the
// backup included. A damaged backup, or a data directory that holds Raft
// state already, is refused, saying why.
func TestRestoreFromBackup(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	p := startFenced(t, dir, addr, historyArgs...)
	c := newClient(t, addr, client.WithRetryTimeout(10*time.Second))
	kept, err := c.Grant(context.Background(), "kept", client.WithTTL(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	h := &history{acked: map[uint64]bool{}}
	h.grant(t, addr, 1500) // enough for a snapshot
	p.stop(t)
	snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*", "state.bin"))
	if len(snaps) == 0 {
		t.Fatal("no snapshot was taken")
	}
	backup := filepath.Join(t.TempDir(), "fence.backup")
	if out, err := exec.Command("cp", snaps[len(snaps)-1], backup).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	p = startFenced(t, dir, addr, historyArgs...)
	h.grant(t, addr, 500)
	p.kill(t)

	restored, raddr := t.TempDir(), freeAddr(t)
	rp := startFenced(t, restored, raddr, "--restore", backup)
	rc := newClient(t, raddr, client.WithRetryTimeout(10*time.Second))
	st, err := rc.Get(context.Background(), "kept")
	if err != nil || st.Lease == nil || st.Lease.Token != kept.Token {
		t.Fatalf("kept after the restore: %+v, %v; want held with token %d", st, err, kept.Token)
	}
	h.checkAbove(t, rc, rp.log)

	refused := func(dir, backup, want string) {
		t.Helper()
		p := spawn(t, dir, freeAddr(t), "--restore", backup)
		select {
		case <-p.exit:
		case <-time.After(20 * time.Second):
			t.Fatalf("fenced --restore %s still runs after 20s; want a refusal", backup)
		}
		log, _ := os.ReadFile(p.log)
		if p.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(string(log), want) {
			t.Errorf("fenced --restore %s: %v, want a refusal saying %q:\n%s", backup, p.cmd.ProcessState, want, tail(log, 2000))
		}
	}
	refused(dir, backup, "already holds Raft state")
	damaged := filepath.Join(t.TempDir(), "damaged.backup")
	b, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x5a
	if err := os.WriteFile(damaged, b, 0o600); err != nil {
		t.Fatal(err)
	}
	refused(t.TempDir(), damaged, "restore "+damaged)
}
