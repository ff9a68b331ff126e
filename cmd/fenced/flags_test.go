package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
)

func TestParseEnvAndFlags(t *testing.T) {
	t.Setenv("FENCED_MAX_TTL", "1m")
	t.Setenv("FENCED_LISTEN", "127.0.0.1:9999")
	cfg, err := parse([]string{"--listen", "127.0.0.1:8888", "--data-dir", "d"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxTTL != time.Minute {
		t.Errorf("max TTL from FENCED_MAX_TTL = %v, want 1m", cfg.MaxTTL)
	}
	if cfg.Listen != "127.0.0.1:8888" {
		t.Errorf("listen = %q: the flag must win over the environment", cfg.Listen)
	}
	if cfg.DataDir != "d" {
		t.Errorf("data dir = %q", cfg.DataDir)
	}
	if cfg.ElectionTimeout != time.Second {
		t.Errorf("election timeout = %v, want etcd's default, 1s (Raft's heartbeat timeout 500ms)", cfg.ElectionTimeout)
	}
	// Limits are on by default.
	if cfg.MaxLeasesPerIdentity <= 0 || cfg.MaxWaitersPerIdentity <= 0 {
		t.Errorf("max leases per identity %d, max waiters per identity %d: want limits by default", cfg.MaxLeasesPerIdentity, cfg.MaxWaitersPerIdentity)
	}
	if cfg.MaxConns <= 0 || cfg.MaxConnsPerAddr <= 0 || cfg.MaxConnsPerAddr > cfg.MaxConns || cfg.ReadTimeout <= 0 {
		t.Errorf("max conns %d, per address %d, read timeout %v: want limits by default, the one per address within the other", cfg.MaxConns, cfg.MaxConnsPerAddr, cfg.ReadTimeout)
	}
}

func TestParseRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  [2]string
		want string
	}{
		{args: []string{"--log-format", "yaml"}, want: "want text or json"},
		{args: []string{"--log-level", "loud"}, want: "want debug, info, warn or error"},
		{args: []string{"--max-ttl", "10ms"}, want: "max TTL"},
		{args: []string{"--listen", "nohost"}, want: "listen address"},
		{args: []string{"--raft-log", "lmdb"}, want: "want bolt or wal"},
		{args: []string{"--raft-segment-size", "4096"}, want: "want 65536 (64 KiB) to"},
		{args: []string{"extra"}, want: "unexpected argument"},
		{args: []string{"--election-timeout", "10ms"}, want: "election timeout 10ms is too short: want 20ms or more"},
		{args: []string{"--election-timeout", "-1s"}, want: "election timeout -1s is too short: want 20ms or more"},
		{args: []string{"--max-leases-per-identity", "-1"}, want: "max leases per identity -1 is negative"},
		{args: []string{"--max-waiters-per-identity", "-5"}, want: "max waiters per identity -5 is negative"},
		{args: []string{"--max-conns", "-1"}, want: "max conns -1 is negative"},
		{args: []string{"--max-conns", "100", "--max-conns-per-addr", "200"}, want: "max conns per address 200 is above max conns 100"},
		{args: []string{"--max-conns", "1000000000"}, want: "above the process's open-file limit"},
		{args: []string{"--read-timeout", "-1s"}, want: "read timeout -1s is negative"},
		{args: []string{"--memory-limit", "lots"}, want: "want a size such as 448MiB"},
		{args: []string{"--memory-limit", "-5MiB"}, want: "want a size such as 448MiB"},
		{args: []string{"--memory-limit", "10MiB"}, want: "below 64MiB"},
		{args: []string{"--memory-limit", "9999999TiB"}, want: "want a size such as 448MiB"},
		{env: [2]string{"FENCED_MAX_TTL", "soon"}, want: "FENCED_MAX_TTL"},
	} {
		if tc.env[0] != "" {
			t.Setenv(tc.env[0], tc.env[1])
		}
		_, err := parse(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse(%q, env %v) = %v, want an error mentioning %q", tc.args, tc.env, err, tc.want)
		}
		if tc.env[0] != "" {
			os.Unsetenv(tc.env[0])
		}
	}
}

// TestSIGTERMShutsDownCleanly checks that SIGTERM makes fenced exit 0 and
// that its data dir opens again with its state; neither the first start,
// the shutdown nor the restart logs a warning or an error.
func TestSIGTERMShutsDownCleanly(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	p := startFenced(t, dir, addr)
	c, err := client.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Grant(context.Background(), "term", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	p.stop(t)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		b, _ := os.ReadFile(p.log)
		t.Fatalf("exit code %d after SIGTERM\n%s", code, b)
	}
	p.noWarnings(t)
	p = startFenced(t, dir, addr)
	st, err := c.Get(context.Background(), "term")
	if err != nil {
		t.Fatal(err)
	}
	if st.Lease == nil || st.Lease.Token != l.Token {
		t.Fatalf("after a clean restart: %+v, want token %d held", st, l.Token)
	}
	p.noWarnings(t)
}

// noWarnings fails t if p logged a warning or an error.
func (p *proc) noWarnings(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("a clean start or stop logged %s", line)
		}
	}
}

// TestVersionFlag: fenced --version prints its build and exits 0 without
// starting, whatever else its flags and environment say; FENCED_VERSION
// alone does not stop it.
func TestVersionFlag(t *testing.T) {
	out, err := exec.Command(fencedBin, "--version", "--data-dir", "/nonexistent/never-created").Output()
	if err != nil {
		t.Fatalf("fenced --version: %v", err)
	}
	lines := strings.Split(string(out), "\n")
	if !strings.HasPrefix(lines[0], "fenced ") || !strings.Contains(string(out), "\nrevision: ") || !strings.Contains(string(out), "\ngo:       go1.") {
		t.Errorf("fenced --version:\n%s", out)
	}
	t.Setenv("FENCED_VERSION", "1.0")
	o, err := parse(nil, io.Discard)
	if err != nil || o.version {
		t.Errorf("with FENCED_VERSION set: version %v, %v; want the flag alone to ask for it", o.version, err)
	}
}
