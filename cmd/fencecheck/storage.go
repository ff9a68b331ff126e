package main

// The storage faults: a node's disk gives back less than fenced wrote, or
// something else, or nothing more fits on it.
//
//   - corrupt: kill -9 a node, flip a byte in the written part of its
//     newest raft-wal segment, restart it;
//   - truncate: the same, the segment cut short inside its written part;
//   - restore: stop a node with SIGTERM and copy its data directory
//     (cold, as docs/operations.md "Backup" does), restart it; after the
//     fault's time kill -9 it, put the copy back, restart it;
//   - fill: the node's disk (a tmpfs of its own, which only root can
//     mount) is filled by a filler file, with no byte left or with half of
//     --min-free-space left, then freed, and the node restarted if it
//     stopped.
//
// After each, fenced either serves, and then its token floor keeps every
// new token above every token the node acknowledged before, or it refuses
// to start, naming its data directory. A refusal is a correct outcome:
// the harness then puts back the copy of the node's data directory it
// took after the kill, before the damage, and starts the node on it. That
// is docs/operations.md "Restore" with the latest clean backup, the
// simplest recovery that is sound: the copy is the node's own state at
// the kill -9, so the node comes back under its own ID with its own votes
// and log, exactly as after a crash. Replacing the node instead (removing
// it through the cluster API, a new ID joining empty) would change the
// run's set of nodes and proxies and prove nothing more about tokens. A
// node must never come back empty under the same ID, and never does here.
//
// Putting one node of a cluster back to an older copy (restore) breaks
// what Raft assumes of a disk: a vote or an acknowledged entry the node
// had written is forgotten. The history check does not look at Raft; it
// checks what fencing needs, that no token is granted twice or out of
// order and no stale write lands, which the token floor keeps whatever
// the node forgot (docs/verification.md says what these faults do not
// show).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fence-dev/fence/internal/history"
)

// segmentSize is fenced's --raft-segment-size when storage faults are on.
// raft-wal allocates a whole segment when it rolls over, so small segments
// fit a small disk, make cheap copies, and roll over often.
const segmentSize = 1 << 20

// storageArgs are fenced's flags when storage faults are on: small
// segments, and snapshots often enough that copies and damage meet a
// compacted log.
var storageArgs = []string{"--raft-segment-size", fmt.Sprint(segmentSize), "--snapshot-threshold", "2048", "--snapshot-interval", "10s"}

// diskSize is the size of each node's tmpfs for the fill fault: room for
// the log a run keeps between snapshots many times over; tmpfs takes
// memory only for what is written.
const diskSize = "64m"

// watchTime bounds how long the harness watches a node started after a
// storage fault for it to serve or stop.
const watchTime = 20 * time.Second

// claimWait bounds how long a storage fault waits for its node while
// another fault (a crash, a stop, another storage fault) has it.
const claimWait = 10 * time.Second

// storageOn reports whether any storage fault is asked for.
func (c config) storageOn() bool {
	for _, k := range storageFaults {
		if slices.Contains(c.faults, k) {
			return true
		}
	}
	return false
}

// newDisk returns the data directory of node id: on a tmpfs of its own
// when the fill fault is on and the machine lets it mount one (disk is
// then the mount point), else in the run's directory (noDisk then says
// why a fill cannot be injected).
func (r *runner) newDisk(id string) (dataDir, disk, noDisk string) {
	plain := filepath.Join(r.dir, "fenced-"+id)
	if !slices.Contains(r.cfg.faults, faultFill) {
		return plain, "", ""
	}
	if os.Geteuid() != 0 {
		return plain, "", "a full disk needs a tmpfs per node, which only root may mount"
	}
	disk = filepath.Join(r.dir, "disk-"+id)
	if err := os.Mkdir(disk, 0o700); err != nil {
		return plain, "", fmt.Sprintf("cannot make a mount point: %v", err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+diskSize+",mode=0700", "tmpfs", disk).CombinedOutput()
	if err != nil {
		os.Remove(disk)
		return plain, "", fmt.Sprintf("cannot mount a tmpfs here (%v: %s)", err, bytes.TrimSpace(out))
	}
	return filepath.Join(disk, "fenced-"+id), disk, ""
}

// releaseDisk keeps a copy of nd's data directory in the run's directory,
// for a look after the run, and unmounts its tmpfs. The node must have
// stopped.
func (r *runner) releaseDisk(nd *node) {
	if nd.disk == "" {
		return
	}
	if out, err := exec.Command("cp", "-a", nd.dataDir, filepath.Join(r.dir, "fenced-"+nd.id)).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck: keep a copy of %s: %v: %s\n", nd.dataDir, err, out)
	}
	if out, err := exec.Command("umount", nd.disk).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck: umount %s: %v: %s\n", nd.disk, err, out)
		return
	}
	os.Remove(nd.disk)
	nd.disk = ""
}

// claim takes nd for a fault that stops, damages or fills it, waiting up
// to d while another fault has it; it reports whether it did.
func (nd *node) claim(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !nd.busy.TryLock() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// doStorage injects a storage fault and heals it; hold waits the fault's
// time.
func (r *runner) doStorage(ctx context.Context, f fault, hold func()) {
	nd, what := r.target(ctx, f.Target)
	if nd == nil {
		r.miss(f.Kind, "there was no leader at the time")
		return
	}
	if f.Kind == faultFill && nd.disk == "" {
		r.miss(faultFill, nd.noDisk)
		return
	}
	if !nd.claim(ctx, claimWait) {
		r.miss(f.Kind, fmt.Sprintf("its node was in another fault for %v", claimWait))
		return
	}
	switch f.Kind {
	case faultCorrupt, faultTruncate:
		defer nd.busy.Unlock()
		r.damage(ctx, nd, what, f, hold)
	case faultFill:
		defer nd.busy.Unlock()
		r.fill(ctx, nd, what, f, hold)
	case faultRestore:
		r.restore(ctx, nd, what, f, hold) // lets go of nd between the copy and its return
	}
}

// target returns node i, or for i = len(r.nodes) the leader at the time,
// and how to name it.
func (r *runner) target(ctx context.Context, i int) (*node, string) {
	var nd *node
	if i < len(r.nodes) {
		nd = r.nodes[i]
	} else {
		nd = r.leader(ctx)
	}
	switch {
	case nd == nil:
		return nil, ""
	case len(r.nodes) == 1:
		return nd, "fenced"
	case i == len(r.nodes):
		return nd, "the leader, " + nd.id
	}
	return nd, nd.id
}

// damage is corrupt and truncate.
func (r *runner) damage(ctx context.Context, nd *node, what string, f fault, hold func()) {
	nd.p.kill()
	clean, err := r.copyData(nd, "clean")
	if err != nil {
		r.fault("error", fmt.Sprintf("%s: copy its data directory before the damage: %v", nd.id, err))
		r.startAfter(ctx, nd, f.Kind, "", "")
		return
	}
	defer os.RemoveAll(clean)
	seg, n, err := newestSegment(nd.dataDir)
	if err != nil {
		r.miss(f.Kind, "no raft-wal segment with written bytes (is the log in raft.db?)")
		r.startAfter(ctx, nd, f.Kind, clean, "")
		return
	}
	off := min(int64(f.Where*float64(n)), n-1)
	rel, _ := filepath.Rel(nd.dataDir, seg)
	if f.Kind == faultCorrupt {
		err = flipByte(seg, off)
		what = fmt.Sprintf("kill -9 %s, flip byte %d of the %d written in %s", what, off, n, rel)
	} else {
		err = os.Truncate(seg, off)
		what = fmt.Sprintf("kill -9 %s, cut %s to %d of its %d written bytes", what, rel, off, n)
	}
	if err != nil {
		r.fault("error", fmt.Sprintf("%s: %s: %v", nd.id, what, err))
	} else {
		r.fault(f.Kind, fmt.Sprintf("%s; restart after %v", what, f.For.Round(time.Millisecond)))
	}
	hold()
	r.startAfter(ctx, nd, f.Kind, clean, "")
}

// restore copies nd's data directory cold, lets it run for the fault's
// time, then kills it and puts the copy back. Between the two it lets go
// of nd, so that crashes and stops of the leader go on.
func (r *runner) restore(ctx context.Context, nd *node, what string, f fault, hold func()) {
	nd.p.signal(syscall.SIGTERM)
	if !nd.p.wait(stopGrace) {
		r.fault("error", fmt.Sprintf("%s did not exit within %v of SIGTERM; killed", nd.id, stopGrace))
		nd.p.kill()
	}
	backup, err := r.copyData(nd, "backup")
	if err != nil {
		r.fault("error", fmt.Sprintf("restore %s: copy its data directory: %v", nd.id, err))
		r.supervise(ctx, nd, faultRestore)
		nd.busy.Unlock()
		return
	}
	defer os.RemoveAll(backup)
	r.fault(faultRestore, fmt.Sprintf("SIGTERM %s, copy its data directory, restart; kill -9 and put the copy back after %v",
		what, f.For.Round(time.Millisecond)))
	if w, _ := r.supervise(ctx, nd, faultRestore); w.exited {
		r.fault("error", fmt.Sprintf("%s did not start again after a clean stop (status %d): %s", nd.id, w.code, w.why))
	}
	nd.busy.Unlock()
	hold()
	nd.busy.Lock() // a heal: wait for the fault that has nd, however long
	defer nd.busy.Unlock()
	nd.p.kill()
	if err := r.putBack(nd, backup); err != nil {
		r.fault("error", fmt.Sprintf("restore %s: %v", nd.id, err))
	}
	r.startAfter(ctx, nd, faultRestore, "", "")
}

// fill fills nd's disk for the fault's time, then frees it and starts the
// node again if it stopped.
func (r *runner) fill(ctx context.Context, nd *node, what string, f fault, hold func()) {
	leave := uint64(0)
	if !f.Full {
		leave = segmentSize // half of --min-free-space, twice the segment size
	}
	wasUp, from := nd.p.running(), nd.p.logSize()
	filler := filepath.Join(nd.disk, "filler")
	left, err := fillDisk(filler, leave)
	if err != nil {
		os.Remove(filler)
		r.fault("error", fmt.Sprintf("fill the disk of %s: %v", nd.id, err))
		return
	}
	r.fault(faultFill, fmt.Sprintf("fill the disk of %s, %d bytes left free; free it after %v", what, left, f.For.Round(time.Millisecond)))
	hold()
	var ready string
	if nd.p.running() {
		_, ready = readyz(ctx, nd.api)
	}
	if err := os.Remove(filler); err != nil {
		r.fault("error", fmt.Sprintf("free the disk of %s: %v", nd.id, err))
	}
	switch {
	case !wasUp:
		r.startAfter(ctx, nd, faultFill, "", "was down (a node that failed to start earlier) when its disk filled; once freed, ")
	case nd.p.running() && strings.Contains(ready, "disk nearly full"):
		r.outcome(faultFill, nd, "ran on, ready answering disk nearly full")
	case nd.p.running():
		r.outcome(faultFill, nd, "ran on") // "ready", or not for another reason
	default:
		code, log := nd.p.exitCode(), nd.p.logFrom(from)
		stopped := "stopped at a failed write, naming its data directory; once freed, "
		if code == 0 || !namesDir(log, nd.dataDir) {
			r.fault("error", fmt.Sprintf("%s stopped on a full disk (status %d) without naming its data directory %s: %s",
				nd.id, code, nd.dataDir, reasonLine(log, nd.dataDir)))
			stopped = "stopped without naming its data directory; once freed, "
		}
		r.startAfter(ctx, nd, faultFill, "", stopped)
	}
}

// startAfter starts nd after a storage fault (through supervise) and
// counts the outcome, after what (what happened before the start). One
// that stops, naming its data directory, refused to start as it should;
// it is then started again on clean, the copy taken before the damage
// (none: nothing to fall back on, which is an error).
func (r *runner) startAfter(ctx context.Context, nd *node, kind, clean, what string) {
	w, again := r.supervise(ctx, nd, kind)
	if again > 0 {
		what += fmt.Sprintf("stopped at start without naming its data directory (%d times; see the notes), then ", again)
	}
	switch {
	case w.ready:
		r.outcome(kind, nd, what+"served")
		return
	case !w.exited:
		r.outcome(kind, nd, what+fmt.Sprintf("started, not ready within %v", watchTime))
		return
	case !w.named:
		// Not the refusal asked for, but safe: a node that does not
		// start grants nothing. An operator would put a backup back.
		again := ""
		if clean != "" {
			again = "; put back to the copy taken before the damage"
		}
		r.outcome(kind, nd, what+"stopped without naming its data directory, at every start"+again)
		r.fault("error", fmt.Sprintf("%s stopped after %s (status %d) without naming its data directory %s: %s", nd.id, kind, w.code, nd.dataDir, w.why))
	case clean == "":
		r.outcome(kind, nd, what+"refused to start, naming its data directory, with no copy to put back")
		r.fault("error", fmt.Sprintf("%s refused to start after %s: %s", nd.id, kind, w.why))
	default:
		r.outcome(kind, nd, what+"refused to start, naming its data directory; put back to the copy taken before the damage")
		r.note(kind, fmt.Sprintf("%s refused to start: %s", nd.id, w.why))
	}
	if clean == "" {
		return
	}
	if err := r.putBack(nd, clean); err != nil {
		r.fault("error", fmt.Sprintf("%s: %v", nd.id, err))
		return
	}
	if w, _ := r.supervise(ctx, nd, kind); w.exited {
		r.fault("error", fmt.Sprintf("%s stopped again on the copy taken before the damage (status %d): %s", nd.id, w.code, w.why))
	}
}

// restarts bounds how many times supervise starts a node again that
// stopped at start without naming its data directory.
const restarts = 4

// supervise starts nd and watches it (startWatched). A node that stops
// without naming its data directory (say, its --join refused while it is
// cut off from the leader) is started again 2 seconds later, up to
// restarts times, as a supervisor would; each such stop is noted in the
// history. It returns the last start's outcome and how many times it
// started the node again.
func (r *runner) supervise(ctx context.Context, nd *node, kind string) (watched, int) {
	w := r.startWatched(ctx, nd)
	again := 0
	for ; w.exited && !w.named && again < restarts && ctx.Err() == nil; again++ {
		r.note(kind, fmt.Sprintf("%s stopped at start (status %d) without naming its data directory: %s; starting it again in 2s", nd.id, w.code, w.why))
		time.Sleep(2 * time.Second)
		w = r.startWatched(ctx, nd)
	}
	return w, again
}

// watched is what became of a node started after a fault.
type watched struct {
	ready  bool   // /readyz answered 200
	exited bool   // the process ended
	code   int    // its exit status
	named  bool   // it ended with a failure status, and an error it logged names the data directory
	why    string // the line of its log that says why
}

// startWatched starts nd and watches it until it is ready, it exits, or
// watchTime passes.
func (r *runner) startWatched(ctx context.Context, nd *node) watched {
	from := nd.p.logSize()
	if err := nd.p.start(); err != nil {
		return watched{exited: true, code: -1, why: err.Error()}
	}
	for deadline := time.Now().Add(watchTime); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		if !nd.p.running() {
			break
		}
		if ok, _ := readyz(ctx, nd.api); ok {
			return watched{ready: true}
		}
	}
	if nd.p.running() {
		return watched{}
	}
	log := nd.p.logFrom(from)
	w := watched{exited: true, code: nd.p.exitCode(), why: reasonLine(log, nd.dataDir)}
	w.named = w.code != 0 && namesDir(log, nd.dataDir)
	return w
}

// errorLines returns the lines of a fenced log that report an error: its
// own (level=ERROR) and a panic's first line.
func errorLines(log string) []string {
	var errs []string
	for l := range strings.Lines(log) {
		if strings.Contains(l, "level=ERROR") || strings.HasPrefix(l, "panic:") {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	return errs
}

// namesDir reports whether an error in log names dir (the start-up line,
// which names it too, does not count).
func namesDir(log, dir string) bool {
	return slices.ContainsFunc(errorLines(log), func(l string) bool { return strings.Contains(l, dir) })
}

// readyz asks the node's /readyz; it returns whether it answered 200, and
// what it said.
func readyz(ctx context.Context, api string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+api+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode == http.StatusOK, string(b)
}

// reasonLine picks from a log the line that says why the process
// stopped: the last error that names dir, else the last error, else the
// last line; shortened.
func reasonLine(log, dir string) string {
	lines := errorLines(log)
	if len(lines) == 0 {
		lines = strings.Split(strings.TrimSpace(log), "\n")
	}
	line := lines[len(lines)-1]
	for _, l := range slices.Backward(lines) {
		if strings.Contains(l, dir) {
			line = l
			break
		}
	}
	if len(line) > 400 {
		line = line[:400] + "..."
	}
	return strings.TrimSpace(line)
}

// outcome counts how a storage fault ended, for the summary, and records
// it in the history.
func (r *runner) outcome(kind string, nd *node, what string) {
	r.mu.Lock()
	if r.outcomes == nil {
		r.outcomes = map[string]map[string]int{}
	}
	if r.outcomes[kind] == nil {
		r.outcomes[kind] = map[string]int{}
	}
	r.outcomes[kind][what]++
	r.mu.Unlock()
	r.note(kind, nd.id+": "+what)
}

// note records in the history how a fault ended.
func (r *runner) note(kind, detail string) {
	r.nemesis.Add(history.Event{Type: history.Note, Proc: "nemesis", F: kind, Detail: detail})
}

// printOutcomes says how the storage faults ended.
func (r *runner) printOutcomes() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.outcomes) == 0 {
		return
	}
	r.printf("after the storage faults, fenced:\n")
	for _, kind := range storageFaults {
		for _, what := range slices.Sorted(maps.Keys(r.outcomes[kind])) {
			r.printf("  %-15s %d  %s\n", kind, r.outcomes[kind][what], what)
		}
	}
}

// copyData copies nd's data directory, as cp -a does, to the run's copies
// directory under the name id.what, replacing an earlier one.
func (r *runner) copyData(nd *node, what string) (string, error) {
	dir := filepath.Join(r.dir, "copies")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	to := filepath.Join(dir, nd.id+"."+what)
	if err := os.RemoveAll(to); err != nil {
		return "", err
	}
	if out, err := exec.Command("cp", "-a", nd.dataDir, to).CombinedOutput(); err != nil {
		return "", fmt.Errorf("cp -a %s %s: %v: %s", nd.dataDir, to, err, bytes.TrimSpace(out))
	}
	return to, nil
}

// putBack replaces nd's data directory by the copy from. The node must
// have stopped.
func (r *runner) putBack(nd *node, from string) error {
	if err := os.RemoveAll(nd.dataDir); err != nil {
		return err
	}
	if out, err := exec.Command("cp", "-a", from, nd.dataDir).CombinedOutput(); err != nil {
		return fmt.Errorf("put back %s: cp -a: %v: %s", from, err, bytes.TrimSpace(out))
	}
	return nil
}

// newestSegment returns the newest raft-wal segment of dataDir that has
// written bytes, and how many: up to its last byte that is not zero
// (raft-wal allocates a segment whole, zeroed).
func newestSegment(dataDir string) (string, int64, error) {
	segs, err := filepath.Glob(filepath.Join(dataDir, "wal", "*.wal"))
	if err != nil {
		return "", 0, err
	}
	// Glob sorts; the names start with the first index, zero-padded.
	for _, seg := range slices.Backward(segs) {
		b, err := os.ReadFile(seg)
		if err != nil {
			return "", 0, err
		}
		n := len(b)
		for n > 0 && b[n-1] == 0 {
			n--
		}
		if n > 0 {
			return seg, int64(n), nil
		}
	}
	return "", 0, errors.New("no raft-wal segment with written bytes in " + dataDir)
}

// flipByte flips some bits of the byte at off in path.
func flipByte(path string, off int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		f.Close()
		return err
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fillDisk writes path until only leave bytes are free on its file system
// (or the disk refuses more, as it may with fenced writing beside it), and
// returns how many bytes are left free.
func fillDisk(path string, leave uint64) (uint64, error) {
	free := func() (uint64, error) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
			return 0, err
		}
		return st.Bavail * uint64(st.Bsize), nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	chunk := make([]byte, 1<<20)
	for range 1 << 12 { // at most 4 GiB
		n, err := free()
		if err != nil || n <= leave {
			break
		}
		if _, err := f.Write(chunk[:min(n-leave, uint64(len(chunk)))]); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			f.Close()
			return 0, err
		}
	}
	if err := f.Close(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		return 0, err
	}
	return free()
}
