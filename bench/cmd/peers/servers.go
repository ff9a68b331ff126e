package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence/client"
)

// startBound bounds how long a server may take to start answering.
const startBound = 60 * time.Second

// proc is a server process this harness started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs cmd with its output in logPath. With awaitLine, it waits for
// the process to print readyLine on stdout; otherwise ready is polled until
// it returns nil. Both waits are bounded by startBound.
func start(name string, cmd *exec.Cmd, logPath string, awaitLine bool, ready func(ctx context.Context) error) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stderr = logf
	var lines io.Reader
	if awaitLine {
		r, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		lines = r
	} else {
		cmd.Stdout = logf
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	exited := make(chan error, 1)
	readyc := make(chan error, 1)
	if awaitLine {
		go func() {
			sc := bufio.NewScanner(lines)
			for sc.Scan() {
				if sc.Text() == readyLine {
					select {
					case readyc <- nil:
					default:
					}
				}
			}
			// Drain until the process exits, so it never blocks writing.
		}()
	}
	go func() {
		exited <- cmd.Wait()
		close(p.done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), startBound)
	defer cancel()
	if !awaitLine {
		go func() {
			for {
				rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
				err := ready(rctx)
				rcancel()
				if err == nil || ctx.Err() != nil {
					readyc <- err
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	select {
	case err := <-readyc:
		if err == nil {
			return p, nil
		}
		p.stop()
		return nil, fmt.Errorf("%s not ready: %w%s", name, err, tail(logPath))
	case err := <-exited:
		return nil, fmt.Errorf("%s exited while starting: %v%s", name, err, tail(logPath))
	case <-ctx.Done():
		p.stop()
		return nil, fmt.Errorf("%s not ready after %s%s", name, startBound, tail(logPath))
	}
}

// stop sends SIGTERM, and SIGKILL to the process group if the process has
// not exited 15 seconds later.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		fmt.Fprintf(os.Stderr, "peers: %s ignored SIGTERM for 15s; killing it\n", p.name)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// tail returns the last lines of a log, for an error message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	lines = lines[max(0, len(lines)-15):]
	return "\n  " + path + ":\n    " + strings.Join(lines, "\n    ")
}

// freePort returns a loopback address nothing listens on right now.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// reexec returns a command that runs this binary in one of its roles.
func reexec(role string, args ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return exec.Command(self, append([]string{role}, args...)...), nil
}

// startFenced runs the real fenced binary with its default, durable
// settings: a one-voter Raft cluster, its log in raft-wal (the default for
// a new data directory), fsync on, tokens signed. It listens
// on addr, or on a free port if addr is empty, with its data in dir/data;
// extra flags come last.
func startFenced(bin, dir, addr string, extra ...string) (*proc, string, error) {
	if addr == "" {
		var err error
		if addr, err = freePort(); err != nil {
			return nil, "", err
		}
	}
	c, err := client.New(addr, client.WithRetryTimeout(time.Second))
	if err != nil {
		return nil, "", err
	}
	defer c.Close()
	cmd := exec.Command(bin, append([]string{"--data-dir", filepath.Join(dir, "data"), "--listen", addr}, extra...)...)
	p, err := start("fenced", cmd, filepath.Join(dir, "fenced.log"), false, func(ctx context.Context) error {
		_, err := c.Get(ctx, "ready")
		return err
	})
	return p, addr, err
}

// startEtcd runs an embedded single-node etcd in a process of its own.
func startEtcd(dir string) (*proc, string, error) {
	caddr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	paddr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	p, err := startEtcdMember(dir, "-dir", filepath.Join(dir, "data"), "-client", caddr, "-peer", paddr)
	return p, caddr, err
}

// startEtcdMember runs etcdMain with args in a process of its own, its
// log in dir.
func startEtcdMember(dir string, args ...string) (*proc, error) {
	cmd, err := reexec(roleEtcd, args...)
	if err != nil {
		return nil, err
	}
	return start("etcd", cmd, filepath.Join(dir, "etcd.stderr"), true, nil)
}

// startResource runs the guarded-write resource on store, guarded by
// fenced's tokens (their signatures verified with the keys fenced serves
// at fencedAddr) or plain.
func startResource(dir, store string, guarded bool, fencedAddr string, srv sharedServers) (*proc, string, error) {
	addr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cmd, err := reexec(roleResource, "-dir", dir, "-listen", addr, "-store", store, fmt.Sprintf("-guard=%t", guarded),
		"-keys", fencedAddr, "-postgres", srv.postgres, "-redis", srv.redis, "-s3", srv.s3)
	if err != nil {
		return nil, "", err
	}
	p, err := start("resource", cmd, filepath.Join(dir, "resource.log"), true, nil)
	return p, "http://" + addr, err
}

// startFollower runs a guard/follow Follower of every scope of the fenced
// at fencedAddr, over a guard.MemoryStore, in a process of its own
// (followerMain); it writes its figures to statsPath when it stops.
func startFollower(dir, fencedAddr, statsPath string) (*proc, error) {
	cmd, err := reexec(roleFollower, "-fence", fencedAddr, "-stats", statsPath)
	if err != nil {
		return nil, err
	}
	return start("follower", cmd, filepath.Join(dir, "follower.log"), true, nil)
}

// startRedis runs redis-server on its defaults, plus the given settings,
// and checks that the server took them.
func startRedis(bin, dir string, settings map[string]string) (*proc, string, error) {
	addr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	host, port, _ := net.SplitHostPort(addr)
	args := []string{"--port", port, "--bind", host, "--dir", dir, "--daemonize", "no"}
	for k, v := range settings {
		args = append(args, "--"+k, v)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	p, err := start("redis-server", exec.Command(bin, args...), filepath.Join(dir, "redis.log"), false, func(ctx context.Context) error {
		return rdb.Ping(ctx).Err()
	})
	if err != nil {
		return nil, "", err
	}
	for k, want := range settings {
		got, err := rdb.ConfigGet(context.Background(), k).Result()
		if err != nil || got[k] != want {
			p.stop()
			return nil, "", errors.Join(err, fmt.Errorf("redis-server: %s is %q, want %q", k, got[k], want))
		}
	}
	return p, addr, nil
}
