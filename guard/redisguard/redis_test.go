package redisguard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// skipOrFail skips a test that needs Redis when Redis is missing, except in
// CI, where a missing Redis is a failure.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (run `make services`, or set FENCE_TEST_REDIS)")
}

// testRedis connects to the shared test Redis named by FENCE_TEST_REDIS
// (default redis://127.0.0.1:63799/0).
func testRedis(t testing.TB) *redis.Client {
	t.Helper()
	url := os.Getenv("FENCE_TEST_REDIS")
	if url == "" {
		url = "redis://127.0.0.1:63799/0"
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("FENCE_TEST_REDIS=%q: %v", url, err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		skipOrFail(t, "redis at %s is unreachable: %v", url, err)
	}
	return rdb
}

// newScope returns a scope name no other test run uses, and deletes its
// keys when the test ends.
func newScope(t testing.TB, rdb redis.UniversalClient) string {
	t.Helper()
	sc := fmt.Sprintf("redisguard-test/%d/%d", time.Now().UnixNano(), rand.Uint32())
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := rdb.Keys(ctx, "*{"+sc+"}*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	})
	return sc
}

// server is a redis-server process of one test, persisting to its own
// directory with appendfsync always.
type server struct {
	dir  string
	port int
	cmd  *exec.Cmd
}

func startServer(t *testing.T) *server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "redis-server not found: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &server{dir: t.TempDir(), port: port}
	s.start(t, bin)
	t.Cleanup(func() {
		if s.cmd != nil {
			s.cmd.Process.Kill()
			s.cmd.Wait()
		}
	})
	return s
}

func (s *server) start(t *testing.T, bin string) {
	t.Helper()
	s.cmd = exec.Command(bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--daemonize", "no", "--logfile", "redis.log")
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr()})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := rdb.Ping(context.Background()).Err()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(s.dir + "/redis.log")
			t.Fatalf("redis-server on %s did not answer: %v\n%s", s.addr(), err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *server) client(t *testing.T) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: s.addr()})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// restart stops the server with SIGTERM (Redis flushes its AOF and exits)
// and starts it again on the same directory and port.
func (s *server) restart(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.cmd.Wait()
	s.cmd = nil
	bin, _ := exec.LookPath("redis-server")
	s.start(t, bin)
}
