package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
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
