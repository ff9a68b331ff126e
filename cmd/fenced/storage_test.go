package main

import (
	"context"
	"errors"
	"io"
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

// cycle acquires and releases scope once, and returns the token.
func cycle(ctx context.Context, c *client.Client, scope string) (uint64, error) {
	l, err := c.Grant(ctx, scope, client.WithTTL(time.Minute))
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
