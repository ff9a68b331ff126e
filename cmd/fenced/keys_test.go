package main

import (
	"context"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/signing"
)

// TestKeyScheduleSurvivesLeaderKill: a rotation's time to sign is in the
// replicated log, so the leader that answered it can die in the publish
// window and the next leader still switches at that time: its grants carry
// the old key before it and the new key from then on, and a guard that
// fetched the keys verifies both.
func TestKeyScheduleSurvivesLeaderKill(t *testing.T) {
	c := startCluster(t, 3, "--key-publish-delay", "5s")
	defer dumpLogs(t, c)
	ctx := context.Background()
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	first, err := admin.Grant(ctx, "before")
	if err != nil {
		t.Fatal(err)
	}
	old := first.FencingToken().KeyID
	rot, err := admin.RotateSigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rot.SignsFrom.After(time.Now()) {
		t.Fatalf("rotation = %+v: the key signs at once, not 5s later (is the log format below 4?)", rot)
	}
	keys, err := signing.Refreshing(ctx, nil, c.addrs(), time.Second)
	if err != nil {
		t.Fatal(err)
	}

	dead := c.leader()
	dead.p.kill(t)
	next := c.leader(c.others(dead)...)
	l, err := admin.Grant(ctx, "during")
	if err != nil {
		t.Fatal(err)
	}
	if answered := time.Now(); answered.Before(rot.SignsFrom) && l.FencingToken().KeyID != old {
		t.Errorf("a grant by %s answered at %v, before the new key's time %v: signed by %s, want the old key %s",
			next.id, answered, rot.SignsFrom, l.FencingToken().KeyID, old)
	}
	time.Sleep(time.Until(rot.SignsFrom))
	l, err = admin.Grant(ctx, "after")
	if err != nil {
		t.Fatal(err)
	}
	if tok := l.FencingToken(); tok.KeyID != rot.KeyID || keys.Verify(tok) != nil {
		t.Fatalf("a grant by %s after %v: signed by %s (verify: %v), want the new key %s", next.id, rot.SignsFrom, tok.KeyID, keys.Verify(tok), rot.KeyID)
	}
	if err := keys.Verify(first.FencingToken()); err != nil {
		t.Errorf("the token signed before the rotation: %v", err)
	}
}
