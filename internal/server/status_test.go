package server_test

import (
	"bufio"
	"context"
	"fmt"
	"html"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/internal/browsertest"
	"github.com/fence-dev/fence/internal/version"
)

// lifeOfAScope makes "orders" show a grant, an expiry (which closes token
// 1 with 2), a second grant (3) and a stale write of the first token
// reported by a guard whose mark was advanced to the closing, and "jobs" a
// lease held now by alice.
func lifeOfAScope(ctx context.Context, t testing.TB, c *client.Client) {
	t.Helper()
	if _, err := c.Grant(ctx, "orders", client.WithHolder("bob"), client.WithTTL(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	awaitExpiry(ctx, t, c, "orders")
	if _, err := c.Grant(ctx, "orders", client.WithHolder("carol"), client.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := c.ReportRejections(ctx, "orders-db", []client.Rejection{{Scope: "orders", Presented: 1, Highest: 2}}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Grant(ctx, "jobs", client.WithHolder("alice"), client.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
}

// TestStatusPage: the page, as served, shows the cluster, the leases held,
// each scope's transitions and the stale rejections.
func TestStatusPage(t *testing.T) {
	ctx := testContext(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	lifeOfAScope(ctx, t, c)
	code, page := get(t, srv.Addr, "/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d", code)
	}
	for _, want := range []string{
		"<b>n1</b>", "ready: leader n1",
		"<td>jobs</td><td>alice</td><td class=\"num\">1</td>",
		"<td>orders</td><td>carol</td><td class=\"num\">3</td>",
		"granted #1 bob</span>", "expired #1 bob</span>", "granted #3 carol</span>", "rejected #1 bob (highest #2)</span>",
		"orders-db refused orders token 1 (held by bob); it had accepted token 2",
		// The build, for the node and in the nodes' table.
		`it runs fenced <span class="mono" id="version">` + html.EscapeString(version.Get().Short()) + "</span>",
		`<td>yes</td><td class="mono">` + html.EscapeString(version.Get().Short()) + "</td></tr>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", page)
	}
	if code, _ := get(t, srv.Addr, "/nowhere"); code != http.StatusNotFound {
		t.Errorf("GET /nowhere = %d, want 404", code)
	}
}

// TestStatusEvents: /events streams lease events as server-sent events
// and resumes after the Last-Event-ID a browser sends back.
func TestStatusEvents(t *testing.T) {
	ctx := testContext(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	events := func(lastID string) (*bufio.Scanner, func()) {
		sctx, cancel := context.WithCancel(ctx)
		req, err := http.NewRequestWithContext(sctx, "GET", "http://"+srv.Addr+"/events?prefix=orders", nil)
		if err != nil {
			t.Fatal(err)
		}
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
			t.Fatalf("GET /events = %s, %s", resp.Status, ct)
		}
		return bufio.NewScanner(resp.Body), func() { cancel(); resp.Body.Close() }
	}
	// next returns the next event's ID and data, skipping comments.
	next := func(sc *bufio.Scanner) (id, kind, data string) {
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "" && kind != "":
				return id, kind, data
			case strings.HasPrefix(line, "id: "):
				id = line[4:]
			case strings.HasPrefix(line, "event: "):
				kind = line[7:]
			case strings.HasPrefix(line, "data: "):
				data = line[6:]
			}
		}
		t.Fatalf("event stream ended: %v", sc.Err())
		return
	}
	sc, stop := events("")
	defer stop()
	if _, err := c.Grant(ctx, "jobs"); err != nil { // not under the prefix
		t.Fatal(err)
	}
	if _, err := c.Grant(ctx, "orders", client.WithHolder("bob")); err != nil {
		t.Fatal(err)
	}
	id, kind, data := next(sc)
	if kind != "lease" || !strings.Contains(data, `"kind":"granted"`) || !strings.Contains(data, `"scope":"orders"`) || !strings.Contains(data, `"holder":"bob"`) {
		t.Fatalf("first event = %s %s %s", id, kind, data)
	}
	stop()

	// A browser that reconnects sends the last ID it saw.
	if _, err := c.Grant(ctx, "orders/2", client.WithHolder("amy")); err != nil {
		t.Fatal(err)
	}
	sc, stop = events(id)
	defer stop()
	if _, kind, data := next(sc); kind != "lease" || !strings.Contains(data, `"scope":"orders/2"`) {
		t.Fatalf("resumed stream's first event = %s %s", kind, data)
	}
	stop()
	// One it cannot resume from is told so, and goes on from now.
	sc, stop = events(fmt.Sprint(uint64(1) << 62))
	defer stop()
	if _, kind, _ := next(sc); kind != "missed" {
		t.Fatalf("stream from an unknown ID began with %q, want missed", kind)
	}
}

// TestStatusPageFollower: a follower's page describes the follower and
// gets the leases from the leader, through the follower.
func TestStatusPageFollower(t *testing.T) {
	ctx := testContext(t)
	_, follower := startPair(ctx, t)
	c := newClient(t, follower.Addr())
	lifeOfAScope(ctx, t, c)
	_, page := get(t, follower.Addr(), "/")
	for _, want := range []string{"This is node <b>n2</b>; leader <b>n1</b>", "loading them from n1"} {
		if !strings.Contains(page, want) {
			t.Errorf("follower's page lacks %q:\n%s", want, page)
		}
	}
	_, leases := get(t, follower.Addr(), "/status/leases")
	if !strings.Contains(leases, "Leases as seen by leader n1") || !strings.Contains(leases, "rejected #1 bob (highest #2)") {
		t.Errorf("leases through the follower:\n%s", leases)
	}
}

// TestStatusPageInBrowser loads a follower's page in a real headless
// Chromium: its script fetches the leases from the leader, then follows
// the event stream and shows a new grant and an expiry without a reload.
func TestStatusPageInBrowser(t *testing.T) {
	b := browsertest.Start(t)
	ctx := testContext(t)
	_, follower := startPair(ctx, t)
	c := newClient(t, follower.Addr())
	lifeOfAScope(ctx, t, c)
	b.Navigate(ctx, "http://"+follower.Addr()+"/")
	b.WaitText(ctx, "This is node n2", "Leases as seen by leader",
		"jobs\talice\t1", "orders\tcarol\t3",
		"granted #1 bob", "expired #1 bob", "rejected #1 bob (highest #2)",
		"orders-db refused orders token 1 (held by bob)")
	b.WaitFor(ctx, "the event stream", `document.getElementById("live").textContent.startsWith("live")`)

	if _, err := c.Grant(ctx, "reports", client.WithHolder("dave"), client.WithTTL(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	b.WaitText(ctx, "granted #1 dave", "expired #1 dave")
	shot := filepath.Join(t.TempDir(), "status.png")
	b.Screenshot(ctx, shot)
	t.Logf("screenshot: %s", shot)
}
