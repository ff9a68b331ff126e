package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
)

// fencedBin is the fenced binary built once for the tests that run it as a
// real process.
var fencedBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fenced-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fencedBin = filepath.Join(dir, "fenced")
	if out, err := exec.Command("go", "build", "-o", fencedBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build fenced: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a fenced process.
type proc struct {
	cmd  *exec.Cmd
	addr string
	log  string
	exit chan struct{}
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t testing.TB) string { return freePort(t, "127.0.0.1") }

// startFenced runs fenced on dataDir and addr and waits until it grants.
func startFenced(t testing.TB, dataDir, addr string, args ...string) *proc {
	t.Helper()
	c, err := client.New(addr, client.WithRetryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return startUntil(t, dataDir, addr, func(ctx context.Context) error {
		_, err := c.Get(ctx, "probe")
		return err
	}, args...)
}

// startUntil spawns fenced and waits until up succeeds.
func startUntil(t testing.TB, dataDir, addr string, up func(context.Context) error, args ...string) *proc {
	t.Helper()
	p := spawn(t, dataDir, addr, args...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := up(ctx)
		cancel()
		if err == nil {
			return p
		}
		select {
		case <-p.exit:
			b, _ := os.ReadFile(p.log)
			t.Fatalf("fenced exited during start-up:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			t.Fatalf("fenced not ready after 20s: %v\n%s", err, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// spawn starts fenced, logging to a file, and kills it when the test ends.
func spawn(t testing.TB, dataDir, addr string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "fenced.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(fencedBin, append([]string{"--data-dir", dataDir, "--listen", addr}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, addr: addr, log: logPath, exit: make(chan struct{})}
	go func() { cmd.Wait(); close(p.exit) }()
	t.Cleanup(func() { p.kill(t) })
	return p
}

// h2cClient speaks HTTP/2 without TLS, as the API's gRPC side needs.
var h2cClient = func() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: t}
}()

// stop sends SIGTERM and waits for the process to exit.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	select {
	case <-p.exit:
	case <-time.After(30 * time.Second):
		t.Fatalf("fenced pid %d did not exit within 30s of SIGTERM", p.cmd.Process.Pid)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.exit:
	case <-time.After(10 * time.Second):
		t.Fatalf("fenced pid %d did not die after SIGKILL", p.cmd.Process.Pid)
	}
}
