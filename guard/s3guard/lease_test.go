package s3guard_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/follow"
	"github.com/fence-dev/fence/guard/s3guard"
)

// TestLeases runs the bucket's guard with a real lease service: a holder
// that pauses past its TTL finds its late write refused once the next
// holder wrote; and with a follower (guard/follow over the bucket's
// Store), a released lease's late write is refused before anyone else
// writes, while in a scope no follower covers it is accepted.
func TestLeases(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
	put := func(scope string, token uint64, body string) error {
		return g.Put(ctx, guard.Write{Token: fence.Token{Scope: scope, Value: token}}, "out", []byte(body))
	}
	refused := func(err error, presented, highest uint64) bool {
		stale, ok := errors.AsType[*guard.StaleError](err)
		return ok && stale.Presented == presented && stale.Highest == highest
	}

	// Granted and never renewed: the holder is paused past its TTL.
	a, err := c.Grant(ctx, "paused", client.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := put("paused", a.Token, "from a"); err != nil {
		t.Fatal(err)
	}
	var b fence.Lease
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err = c.Grant(ctx, "paused"); err == nil {
			break
		}
		if !errors.Is(err, fence.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("the next grant: %v", err)
		}
	}
	if err := put("paused", b.Token, "from b"); err != nil {
		t.Fatal(err)
	}
	if err := put("paused", a.Token, "late from a"); !refused(err, a.Token, b.Token) {
		t.Fatalf("the paused holder's late write: %v; want refused by token %d", err, b.Token)
	}
	if got, err := g.Get(ctx, "paused", "out"); err != nil || string(got) != "from b" {
		t.Fatalf("Get = %q, %v; want the next holder's data", got, err)
	}

	f := follow.New(c, s3guard.NewStore(api, bucket, s3guard.WithPrefix(prefix)), "followed/",
		follow.WithLogger(slog.New(slog.DiscardHandler)))
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	defer func() {
		cancel()
		<-done
	}()
	waitFor(t, "the follower's watch", func() bool { return f.Position() != 0 })
	for _, scope := range []string{"followed/job", "unfollowed/job"} {
		l, err := c.Grant(ctx, scope)
		if err != nil {
			t.Fatal(err)
		}
		if err := put(scope, l.Token, "done"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Release(ctx, scope, l.ID); err != nil {
			t.Fatal(err)
		}
		if scope == "followed/job" {
			waitFor(t, "the follower to record the closing", func() bool {
				m, err := g.Highest(ctx, scope)
				return err == nil && m.Token == l.Token+1
			})
			if err := put(scope, l.Token, "late"); !refused(err, l.Token, l.Token+1) {
				t.Errorf("%s: the released lease's late write: %v; want refused by the closing token %d", scope, err, l.Token+1)
			}
			// The follower kept the object the holder wrote.
			if got, err := g.Get(ctx, scope, "out"); err != nil || string(got) != "done" {
				t.Errorf("%s: Get = %q, %v", scope, got, err)
			}
		} else if err := put(scope, l.Token, "late"); err != nil {
			t.Errorf("%s: the late write without a follower: %v; want accepted (the window a follower closes)", scope, err)
		}
	}
}

// waitFor polls cond for at most 20 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
