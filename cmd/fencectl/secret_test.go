//go:build unix

package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/client"
)

// anyLeaseID matches a lease ID in its text form, for the leases whose IDs
// the test never learns (the one fencectl exec holds). A 64-byte signature
// in base64url holds 32 hexadecimal digits in a row with a chance below
// 1e-15.
var anyLeaseID = regexp.MustCompile(`[0-9a-fA-F]{32}`)

// TestLeaseIDsStaySecret runs a signing fenced, logging at debug, through
// a full life of leases: acquire, renew (single and batch), release, an
// acquire that waits in line, an expiry, AcquireBatch and ReleaseBatch, a
// watch of it all, the status page, and fencectl exec. The lease ID renews
// and releases a lease, so it must appear in none of what others can read:
// fenced's log, the token texts (they go to every guarded resource and its
// logs), the watch events, the status page, and the environment and
// messages of exec's command. Each lease ID issued is looked for in hex and
// base64; exec's, which the test never sees, as any 32 hexadecimal digits.
func TestLeaseIDsStaySecret(t *testing.T) {
	t.Parallel()
	s := startFenced(t, "--sign-tokens=true", "--log-level=debug")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(s.addr, client.WithHolder("secret-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var (
		ids   []fence.LeaseID
		texts = map[string]string{} // what others can read, by where it came from
	)
	issued := func(where string, id fence.LeaseID, token fence.Token) {
		t.Helper()
		if id.IsZero() || !token.Signed() {
			t.Fatalf("%s: lease ID %s, token %s; want an ID and a signed token", where, id, token)
		}
		ids = append(ids, id)
		texts[where+" token"] = token.String()
	}

	// A lease held from the start, so that the watch's first event (held)
	// shows it is live before anything else happens.
	l0, err := c.Acquire(ctx, "secret/start")
	if err != nil {
		t.Fatal(err)
	}
	issued("acquire", l0.ID(), l0.Token())
	events := watchAll(ctx, t, c)
	events.waitFor(ctx, t, "secret/start")

	// Acquire, renew, renew in a batch, release.
	a, err := c.Acquire(ctx, "secret/a")
	if err != nil {
		t.Fatal(err)
	}
	issued("acquire a", a.ID(), a.Token())
	renewed, err := c.Renew(ctx, "secret/a", a.ID())
	if err != nil {
		t.Fatal(err)
	}
	texts["renew token"] = renewed.FencingToken().String()
	rs, err := c.RenewBatch(ctx, []client.Renewal{{Scope: "secret/a", ID: a.ID()}})
	if err != nil || len(rs) != 1 || rs[0].Err != nil {
		t.Fatalf("RenewBatch = %+v, %v", rs, err)
	}
	texts["status page"] = httpGet(ctx, t, "http://"+s.addr+"/")
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// An acquire that waits in line behind another lease.
	b1, err := c.Acquire(ctx, "secret/b")
	if err != nil {
		t.Fatal(err)
	}
	issued("acquire b1", b1.ID(), b1.Token())
	waited := make(chan *client.Lease, 1)
	go func() {
		l, err := c.Acquire(ctx, "secret/b", client.WithWait())
		if err != nil {
			t.Error(err)
		}
		waited <- l
	}()
	for st, err := c.Get(ctx, "secret/b"); st.Waiters == 0; st, err = c.Get(ctx, "secret/b") {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := b1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b2 := <-waited
	if b2 == nil {
		t.FailNow()
	}
	issued("waiting acquire", b2.ID(), b2.Token())
	if err := b2.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A lease nobody renews expires.
	short, err := c.Grant(ctx, "secret/c", client.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	issued("grant", short.ID, short.FencingToken())
	events.waitFor(ctx, t, "expired secret/c")

	// AcquireBatch and ReleaseBatch, as a Connect client calls them.
	api := fencev1connect.NewLeaseServiceClient(http.DefaultClient, "http://"+s.addr)
	acqs, err := api.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{Acquires: []*fencev1.AcquireRequest{
		{Scope: "secret/d1", Holder: "batch"}, {Scope: "secret/d2", Holder: "batch"},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	var rels []*fencev1.ReleaseRequest
	for i, r := range acqs.Msg.Results {
		if r.Lease == nil {
			t.Fatalf("AcquireBatch result %d: %v", i, r.Failure)
		}
		id, err := fence.ParseLeaseID(r.Lease.LeaseId)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := fence.ParseToken(r.Lease.TokenText)
		if err != nil {
			t.Fatal(err)
		}
		issued(fmt.Sprintf("AcquireBatch %d", i), id, tok)
		rels = append(rels, &fencev1.ReleaseRequest{Scope: r.Lease.Scope, LeaseId: r.Lease.LeaseId})
	}
	if _, err := api.ReleaseBatch(ctx, connect.NewRequest(&fencev1.ReleaseBatchRequest{Releases: rels})); err != nil {
		t.Fatal(err)
	}

	// fencectl exec: what its command gets, and what fencectl says.
	r := s.want(t, 0, "exec", "secret/e", "--", "env")
	texts["exec environment"], texts["exec stderr"] = r.stdout, r.stderr
	if !strings.Contains(r.stdout, "FENCE_TOKEN=fence:v") {
		t.Errorf("exec's command got no FENCE_TOKEN:\n%s", r.stdout)
	}

	// The last event: once the watch has it, it has had all the others.
	if err := l0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	texts["watch events"] = events.waitFor(ctx, t, "released secret/start")

	// fenced writes its event lines from a goroutine of its own, in order,
	// some time after the watch has the event: once the last one's line
	// is in the log, every earlier one's is.
	var log []byte
	for {
		var err error
		if log, err = os.ReadFile(s.log); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(log), `msg="lease released" scope=secret/start `) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("fenced's log has no line for the release of secret/start:\n%s", log)
		case <-time.After(10 * time.Millisecond):
		}
	}
	texts["fenced log"] = string(log)
	if strings.Contains(string(log), " lease_id=") {
		t.Errorf("fenced logs the attribute lease_id; log the fingerprint as lease instead (internal/server/eventlines.go: slog.String(\"lease\", e.Lease.ID.Fingerprint()))")
	}
	// The log must be the one of this run, at debug level, or the test
	// proves nothing.
	for _, want := range []string{"secret/a", "lease renewed", "secret/d2", "secret/e"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("fenced's log lacks %q:\n%s", want, log)
		}
	}

	for where, text := range texts {
		for _, id := range ids {
			for _, enc := range encodings(id) {
				if i := strings.Index(text, enc); i >= 0 {
					t.Errorf("%s holds lease ID %s (as %s): %s", where, id, enc, around(text, i, len(enc)))
					break
				}
			}
		}
		if loc := anyLeaseID.FindStringIndex(text); loc != nil {
			t.Errorf("%s holds what looks like a lease ID: %s", where, around(text, loc[0], loc[1]-loc[0]))
		}
	}
	if len(ids) != 7 {
		t.Errorf("the run issued %d lease IDs the test knows, want 7", len(ids))
	}
}

// encodings returns the forms in which id could be written out.
func encodings(id fence.LeaseID) []string {
	return []string{
		id.String(), strings.ToUpper(id.String()),
		base64.StdEncoding.EncodeToString(id[:]), base64.RawStdEncoding.EncodeToString(id[:]),
		base64.URLEncoding.EncodeToString(id[:]), base64.RawURLEncoding.EncodeToString(id[:]),
		// A part is a part of the secret: what watch events and the
		// status page used to show was the first 8 digits.
		hex.EncodeToString(id[:4]), hex.EncodeToString(id[12:]),
	}
}

// around returns text's line around [i, i+n), for an error message.
func around(text string, i, n int) string {
	start := strings.LastIndexByte(text[:i], '\n') + 1
	end := strings.IndexByte(text[i+n:], '\n')
	if end < 0 {
		return text[start:]
	}
	return text[start : i+n+end]
}

func httpGet(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(b)
}

// eventLog is every event of a watch, one line each, as %+v prints it.
type eventLog struct {
	mu    sync.Mutex
	lines []string
	more  chan struct{} // signalled after each event
}

// watchAll watches every scope until ctx ends.
func watchAll(ctx context.Context, t *testing.T, c *client.Client) *eventLog {
	e := &eventLog{more: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ev, err := range c.Watch(ctx, "", 0, client.WithHeld()) {
			if err != nil {
				return
			}
			e.mu.Lock()
			e.lines = append(e.lines, fmt.Sprintf("%s %s %+v", ev.Kind, ev.Scope, ev))
			e.mu.Unlock()
			select {
			case e.more <- struct{}{}:
			default:
			}
		}
	}()
	return e
}

// waitFor waits until an event's line holds want, and returns all lines.
func (e *eventLog) waitFor(ctx context.Context, t *testing.T, want string) string {
	t.Helper()
	for {
		e.mu.Lock()
		all := strings.Join(e.lines, "\n")
		e.mu.Unlock()
		if strings.Contains(all, want) {
			return all
		}
		select {
		case <-e.more:
		case <-ctx.Done():
			t.Fatalf("no event %q; events:\n%s", want, all)
		}
	}
}
