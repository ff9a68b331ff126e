package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/httpguard"
)

func (a *app) newDemoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Play the two stale-writer stories, with and without the fence",
		Long: `Demo starts a fenced and a guarded resource in this process (an HTTP
register whose data and highest token live in one bbolt file) and plays
the two timelines of the fencing-token story:

  pause:   A acquires, pauses past its TTL, the lease expires, B acquires a
           greater token and writes, A resumes and writes with its old token;
  delay:   A sends a write that the network holds back, A's lease expires,
           B acquires and writes, then A's delayed write arrives.

It plays both with the guard on (A's writes are rejected, B's value stays)
and off (A's write lands: a lost update). The exit status is 0 only if,
with the guard on, every stale write was rejected.`,
		Args: exactArgs(),
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			ok, err := runDemo(cmd.Context(), a.stdout)
			if err != nil {
				return err
			}
			if !ok {
				return &statusError{code: exitError, name: "error", err: errors.New("demo: a stale write got through the guard")}
			}
			return nil
		}),
	}
}

// register is the guarded resource: one value per scope, with the holder
// whose write it was.
type register struct {
	store   *boltguard.Store
	guarded bool
	srv     *httptest.Server
}

var dataBucket = []byte("register")

func newRegister(dir string, guarded bool) (*register, error) {
	s, err := boltguard.Open(filepath.Join(dir, "register.db"))
	if err != nil {
		return nil, err
	}
	r := &register{store: s, guarded: guarded}
	put := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var err error
		if tx, ok := boltguard.TxFromContext(req.Context()); ok {
			err = putValue(tx, req, body) // in the transaction that checked the token
		} else {
			err = r.store.DB().Update(func(tx *bbolt.Tx) error { return putValue(tx, req, body) })
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	var h http.Handler = put
	if guarded {
		// The check and the write share one bbolt transaction.
		g := guard.New(r.store, guard.WithLogger(slog.New(slog.DiscardHandler)))
		h = httpguard.Middleware(g, "", httpguard.WithScopeFunc(scopeOf))(put)
	}
	r.srv = httptest.NewServer(h)
	return r, nil
}

func scopeOf(req *http.Request) string { return strings.TrimPrefix(req.URL.Path, "/") }

func putValue(tx *bbolt.Tx, req *http.Request, body []byte) error {
	b, err := tx.CreateBucketIfNotExists(dataBucket)
	if err != nil {
		return err
	}
	return b.Put([]byte(scopeOf(req)), body)
}

func (r *register) value(scope string) string {
	var v string
	r.store.DB().View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket(dataBucket); b != nil {
			v = string(b.Get([]byte(scope)))
		}
		return nil
	})
	return v
}

func (r *register) close() { r.srv.Close(); r.store.Close() }

// demoLease is a grant held without keep-alive: the demo's "paused"
// process renews nothing.
type demoLease struct {
	fence.Lease
	lost error
}

func (l *demoLease) Token() fence.Token   { return l.FencingToken() }
func (l *demoLease) Err() error           { return l.lost }
func (l *demoLease) MarkLost(cause error) { l.lost = cause }

// timeline prints numbered events with the time since the story began.
type timeline struct {
	w     io.Writer
	start time.Time
}

func (t *timeline) say(who, format string, args ...any) {
	fmt.Fprintf(t.w, "  %6.2fs  %-3s %s\n", time.Since(t.start).Seconds(), who, fmt.Sprintf(format, args...))
}

func runDemo(ctx context.Context, w io.Writer) (bool, error) {
	fs := fencetest.NewServer()
	defer fs.Close()
	c := fs.Client()
	defer c.Close()
	ok := true
	for _, guarded := range []bool{true, false} {
		for _, story := range []string{"pause", "delay"} {
			staleRejected, err := playStory(ctx, w, c, story, guarded)
			if err != nil {
				return false, err
			}
			if guarded && !staleRejected {
				ok = false
			}
		}
	}
	if ok {
		fmt.Fprintln(w, "With the guard on, every stale write was rejected.")
	}
	return ok, nil
}

func playStory(ctx context.Context, w io.Writer, c *client.Client, story string, guarded bool) (bool, error) {
	dir, err := tempDir()
	if err != nil {
		return false, err
	}
	defer removeAll(dir)
	reg, err := newRegister(dir, guarded)
	if err != nil {
		return false, err
	}
	defer reg.close()
	scope := fmt.Sprintf("demo/%s-%v", story, map[bool]string{true: "guarded", false: "unguarded"}[guarded])
	mode := "guard ON"
	if !guarded {
		mode = "guard OFF"
	}
	fmt.Fprintf(w, "\n== %s story, %s (%s)\n", story, mode, scope)
	t := &timeline{w: w, start: time.Now()}
	const ttl = time.Second

	la, err := c.Grant(ctx, scope, client.WithTTL(ttl), client.WithHolder("A"))
	if err != nil {
		return false, err
	}
	a := &demoLease{Lease: la}
	t.say("A", "acquires %s -> token %d", scope, la.Token)

	send := func(l *demoLease, body string, delay time.Duration) (int, error) {
		var rt http.RoundTripper = httpguard.NewTransport(l, nil)
		if delay > 0 {
			rt = delayed{rt, delay}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, reg.srv.URL+"/"+scope, strings.NewReader(body))
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	verdict := func(code int) string {
		if code == http.StatusConflict {
			return "409 rejected as stale"
		}
		return fmt.Sprintf("%d accepted", code)
	}

	var delayedDone chan int
	if story == "delay" {
		t.say("A", "sends write(%d); the network holds the packet back", la.Token)
		delayedDone = make(chan int, 1)
		go func() {
			code, _ := send(a, "written by A", 2*ttl)
			delayedDone <- code
		}()
	} else {
		t.say("A", "pauses (a long GC pause): no renewals, no writes")
	}
	b, err := c.Grant(ctx, scope, client.WithTTL(10*time.Second), client.WithHolder("B"), client.WithWait())
	if err != nil {
		return false, err
	}
	t.say("", "A's lease expires")
	t.say("B", "acquires %s -> token %d", scope, b.Token)
	code, err := send(&demoLease{Lease: b}, "written by B", 0)
	if err != nil {
		return false, err
	}
	t.say("B", "writes with token %d -> %s", b.Token, verdict(code))

	var stale int
	if story == "delay" {
		stale = <-delayedDone
		t.say("A", "delayed write(%d) arrives -> %s", la.Token, verdict(stale))
	} else {
		stale, err = send(a, "written by A", 0)
		if err != nil {
			return false, err
		}
		t.say("A", "resumes and writes with token %d -> %s", la.Token, verdict(stale))
		if a.lost != nil {
			t.say("A", "its lease now reports itself lost; it stops")
		}
	}
	final := reg.value(scope)
	fmt.Fprintf(w, "  final value: %q", final)
	if final != "written by B" {
		fmt.Fprint(w, "  <- LOST UPDATE: the stale writer overwrote the current holder")
	}
	fmt.Fprintln(w)
	_, _ = c.Release(ctx, scope, b.ID)
	return stale == http.StatusConflict && final == "written by B", nil
}

// delayed holds a request back before sending it, like a slow network.
type delayed struct {
	next  http.RoundTripper
	delay time.Duration
}

func (d delayed) RoundTrip(r *http.Request) (*http.Response, error) {
	time.Sleep(d.delay)
	return d.next.RoundTrip(r)
}

func tempDir() (string, error) { return os.MkdirTemp("", "fencectl-demo-") }

func removeAll(dir string) { os.RemoveAll(dir) }
