package client

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/fence-dev/fence/internal/server"
)

// wait bounds every wait in these tests: a limit after which a test gives
// up, never a performance expectation.
const wait = 10 * time.Second

// StartServer runs a real one-node service for one test, with the
// configuration edit makes (nil: the defaults), for this package's tests
// inside and outside it. fencetest cannot serve the tests inside: it
// imports this package.
func StartServer(t *testing.T, edit func(*server.Config)) *server.Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.NoClockFloor = true
	if edit != nil {
		edit(&cfg)
	}
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		s.Close(ctx)
	})
	for deadline := time.Now().Add(wait); !s.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the service is not ready after %v", wait)
		}
	}
	return s
}
