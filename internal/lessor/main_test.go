package lessor

import (
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/raftnode"
)

// TestMain checks that a closed lessor leaves no office behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startLessor returns the lessor of a one-node cluster once it serves.
func startLessor(t testing.TB) (*Lessor, *raftnode.Node) {
	t.Helper()
	return startLessorWith(t, Config{})
}

func startLessorWith(t testing.TB, cfg Config) (*Lessor, *raftnode.Node) {
	t.Helper()
	l := New(cfg)
	n, err := raftnode.Open(raftnode.Config{
		NodeID:   "n1",
		DataDir:  t.TempDir(),
		Logger:   slog.New(slog.DiscardHandler),
		OnEvents: func(es []fsm.Event) { l.Applied(es, time.Now()) },
		OnLeader: l.Lead,
	})
	if err != nil {
		t.Fatal(err)
	}
	l.Open(n)
	t.Cleanup(func() {
		l.Stop()
		n.Close()
		l.Wait()
	})
	for end := time.Now().Add(20 * time.Second); !l.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("not ready")
		}
	}
	return l, n
}
