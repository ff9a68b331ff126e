package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/follow"
	"github.com/fence-dev/fence/guard/guardreport"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/guard/sqlguard"

	_ "modernc.org/sqlite" // the register's database/sql driver
)

func (a *app) newDemoCmd() *cobra.Command {
	var store string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Play the two stale-writer stories, with and without the fence",
		Long: `Demo starts a fenced and a guarded resource in this process (an HTTP
register whose data and highest tokens live in one SQLite database, with
--store bolt one bbolt file, or with --store s3://BUCKET[/PREFIX] a bucket
through guard/s3guard, reached as fencectl guard follow reaches one, its
objects deleted after each story) and plays the two timelines of the
fencing-token story:

  pause:   A acquires, pauses past its TTL, the lease expires, B acquires a
           greater token and writes, A resumes and writes with its old token;
  delay:   A sends a write that the network holds back, A's lease expires,
           B acquires and writes, then A's delayed write arrives.

It plays both with the guard on (A's writes are rejected, B's value stays)
and off (A's write lands: a lost update). Then, with the guard on, a third
timeline, in which nobody else writes:

  late:    A acquires and writes, sends a write that the network holds back,
           A's lease expires, then A's delayed write arrives.

Without a follower, the guard has seen no token above A's, so the late
write is ACCEPTED: the window between the end of a lease and the next
holder's first write. With a follower (guard/follow, as fencectl guard
follow runs for the guards inside a database), the service's closing
token, which ended A's lease and is granted to nobody, is already the
register's mark, and the late write is REFUSED. The exit status is 0 only
if, with the guard on, every stale write was rejected, the late one with
a follower included.

With --addr, the leases come from the fenced (or cluster) at that address
instead, in scopes under demo/ (with --ca, --cert, --key and --auth-token
as for the other commands); the register stays in this process, and its
guard reports the stale writes it refuses to that fenced, as
guard/guardreport does, under the name "fencectl demo": its status page,
its metrics and "fencectl watch demo/" show them. FENCE_ADDR
alone does not move the demo off its own fenced: it plays against a
service only when its command line names one.`,
		Args: exactArgs(),
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			open, known := registerStores[store]
			if !known && strings.HasPrefix(store, "s3://") {
				t, err := parseFollowTarget(store)
				if err != nil {
					return usageErrorf("--store: %v", err)
				}
				open, known = openS3Register(t), true
			}
			if !known {
				return usageErrorf("--store %q: want sqlite or bolt, or s3://BUCKET[/PREFIX]", store)
			}
			var c *client.Client
			if cmd.Flags().Changed("addr") {
				var err error
				if c, err = a.client(); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "Leases from the fenced at %s.\n", a.addr)
			} else {
				fs := fencetest.NewServer()
				defer fs.Close()
				c = fs.Client()
				fmt.Fprintln(a.stdout, "Leases from a fenced in this process (--addr names another).")
			}
			defer c.Close()
			ok, err := runDemo(cmd.Context(), a.stdout, c, open)
			if err != nil {
				return err
			}
			if !ok {
				return &statusError{code: exitError, name: "error", err: errors.New("demo: a stale write got through the guard")}
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&store, "store", "sqlite", "where the register keeps its values and the guard its marks: sqlite (guard/sqlguard), bolt (guard/boltguard) or s3://BUCKET[/PREFIX] (guard/s3guard; the AWS environment variables as for guard follow)")
	return cmd
}

// registerStore is the register's database. Its values and the guard's
// marks live in it together, so that a token check and the write it
// admits commit as one transaction.
type registerStore interface {
	guard.Store
	// put sets scope's value: in the transaction of the Fence call whose
	// apply received ctx, if there is one, else in a transaction of its own.
	put(ctx context.Context, scope, value string) error
	get(scope string) string
	// mark is the highest token the guard's store holds for scope.
	mark(scope string) uint64
	close()
	// name is the database's name; guardName, the guard package that
	// keeps its marks.
	name() string
	guardName() string
}

var registerStores = map[string]func(dir string) (registerStore, error){
	"sqlite": openSQLiteRegister,
	"bolt":   openBoltRegister,
}

// register is the guarded resource: one value per scope, the text of the
// write that set it.
type register struct {
	store registerStore
	srv   *httptest.Server
}

// newRegister serves store over HTTP; guarded, behind httpguard, with obs
// told of every write the guard accepts or refuses.
func newRegister(store registerStore, guarded bool, obs guard.Observer) (*register, error) {
	r := &register{store: store}
	put := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if err := store.put(req.Context(), scopeOf(req), string(body)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	var h http.Handler = put
	if guarded {
		g := guard.New(store, guard.WithLogger(slog.New(slog.DiscardHandler)), guard.WithObserver(obs))
		fenced, err := httpguard.Middleware(g, "", httpguard.WithScopeFunc(scopeOf))
		if err != nil {
			return nil, err
		}
		h = fenced(put)
	}
	r.srv = httptest.NewServer(h)
	return r, nil
}

func scopeOf(req *http.Request) string { return strings.TrimPrefix(req.URL.Path, "/") }

func (r *register) value(scope string) string { return r.store.get(scope) }

func (r *register) close() { r.srv.Close(); r.store.close() }

// sqliteRegister keeps the values in a SQLite table beside sqlguard's
// fence table.
type sqliteRegister struct{ *sqlguard.Store }

const upsertRegister = "INSERT INTO register (scope, value) VALUES (?1, ?2) ON CONFLICT (scope) DO UPDATE SET value = excluded.value"

func openSQLiteRegister(dir string) (registerStore, error) {
	// BEGIN IMMEDIATE and a busy timeout: writers wait for each other
	// rather than fail with SQLITE_BUSY (see sqlguard's documentation).
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "register.db")+"?_txlock=immediate&_busy_timeout=5000&_journal_mode=WAL")
	if err != nil {
		return nil, err
	}
	s, err := sqlguard.New(db, sqlguard.SQLite)
	if err == nil {
		err = s.CreateTable(context.Background())
	}
	if err == nil {
		_, err = db.Exec("CREATE TABLE IF NOT EXISTS register (scope TEXT PRIMARY KEY, value TEXT NOT NULL)")
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return sqliteRegister{s}, nil
}

func (r sqliteRegister) put(ctx context.Context, scope, value string) error {
	var err error
	if tx, ok := sqlguard.TxFromContext(ctx); ok {
		_, err = tx.ExecContext(ctx, upsertRegister, scope, value) // in the transaction that checked the token
	} else {
		_, err = r.DB().ExecContext(ctx, upsertRegister, scope, value)
	}
	return err
}

func (r sqliteRegister) get(scope string) string {
	var v string
	_ = r.DB().QueryRow("SELECT value FROM register WHERE scope = ?1", scope).Scan(&v)
	return v
}

func (r sqliteRegister) mark(scope string) uint64 {
	m, _ := r.Highest(context.Background(), scope)
	return m.Token
}

func (r sqliteRegister) close() { r.Close(); r.DB().Close() }

func (sqliteRegister) name() string      { return "SQLite" }
func (sqliteRegister) guardName() string { return "sqlguard" }

// boltRegister keeps the values in a bucket beside boltguard's.
type boltRegister struct{ *boltguard.Store }

var dataBucket = []byte("register")

func openBoltRegister(dir string) (registerStore, error) {
	s, err := boltguard.Open(filepath.Join(dir, "register.db"))
	if err != nil {
		return nil, err
	}
	return boltRegister{s}, nil
}

func (r boltRegister) put(ctx context.Context, scope, value string) error {
	put := func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(dataBucket)
		if err != nil {
			return err
		}
		return b.Put([]byte(scope), []byte(value))
	}
	if tx, ok := boltguard.TxFromContext(ctx); ok {
		return put(tx) // in the transaction that checked the token
	}
	return r.DB().Update(put)
}

func (r boltRegister) get(scope string) string {
	var v string
	r.DB().View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket(dataBucket); b != nil {
			v = string(b.Get([]byte(scope)))
		}
		return nil
	})
	return v
}

func (r boltRegister) mark(scope string) uint64 {
	m, _ := r.Highest(scope)
	return m.Token
}

func (r boltRegister) close() { r.Close() }

func (boltRegister) name() string      { return "bbolt" }
func (boltRegister) guardName() string { return "boltguard" }

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

// demoGuardName is the name the demo's guard reports its refusals under.
const demoGuardName = "fencectl demo"

func runDemo(ctx context.Context, w io.Writer, c *client.Client, open func(dir string) (registerStore, error)) (bool, error) {
	// The guard reports the stale writes it refuses to fenced, as a real
	// one does through guardreport, so that the service's status page,
	// metrics and watchers show them.
	var refused rejectionCount
	rep := guardreport.New(c, demoGuardName, guardreport.WithObserver(&refused), guardreport.WithLogger(slog.New(slog.DiscardHandler)))
	ok := true
	for _, guarded := range []bool{true, false} {
		for _, story := range []string{"pause", "delay"} {
			staleRejected, err := playStory(ctx, w, c, open, story, guarded, rep)
			if err != nil {
				rep.Close(ctx)
				return false, err
			}
			if guarded && !staleRejected {
				ok = false
			}
		}
	}
	var lateAccepted bool
	for _, followed := range []bool{false, true} {
		refused, err := playLate(ctx, w, c, open, followed, rep)
		if err != nil {
			rep.Close(ctx)
			return false, err
		}
		if followed && !refused {
			ok = false
		}
		if !followed {
			lateAccepted = !refused
		}
	}
	fmt.Fprintln(w)
	if ok {
		fmt.Fprintln(w, "With the guard on, every stale write was rejected: those of a superseded token, and with a follower the late write of an ended lease.")
	}
	if lateAccepted {
		fmt.Fprintln(w, "Without a follower, the ended lease's late write was ACCEPTED: nobody had written since, so the guard knew no newer token (the window a follower closes).")
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rep.Close(rctx); err != nil {
		fmt.Fprintf(w, "The guard could not report its %d refused writes to fenced: %v\n", refused.n.Load(), err)
	} else if n := refused.n.Load(); n > 0 {
		fmt.Fprintf(w, "The guard reported its %d refused writes to fenced as %q: its status page and \"fencectl watch demo/\" show them.\n", n, demoGuardName)
	}
	return ok, nil
}

// rejectionCount is a guard.Observer that counts the stale writes refused.
// It is safe for concurrent use.
type rejectionCount struct{ n atomic.Int64 }

func (*rejectionCount) Accepted(string)              { /* only refusals are counted */ }
func (r *rejectionCount) Rejected(*guard.StaleError) { r.n.Add(1) }

// demoTTL is the TTL of the leases A holds and does not renew.
const demoTTL = time.Second

// stage is one story's register, in a database of its own, and the
// timeline it is told on.
type stage struct {
	ctx   context.Context
	dir   string
	store registerStore
	reg   *register
	scope string
	t     *timeline
}

// newStage opens a register for the story in a temporary directory and
// prints the story's header; close removes it all.
func newStage(ctx context.Context, w io.Writer, open func(dir string) (registerStore, error), scope, story string, guarded bool, obs guard.Observer) (*stage, error) {
	dir, err := tempDir()
	if err != nil {
		return nil, err
	}
	store, err := open(dir)
	if err != nil {
		removeAll(dir)
		return nil, err
	}
	reg, err := newRegister(store, guarded, obs)
	if err != nil {
		store.close()
		removeAll(dir)
		return nil, err
	}
	register := store.name() + " via " + store.guardName()
	if !guarded {
		// The same database, but no guard reads or moves its marks.
		register = store.name() + ", unguarded"
	}
	fmt.Fprintf(w, "\n== %s (%s; register in %s)\n", story, scope, register)
	return &stage{ctx: ctx, dir: dir, store: store, reg: reg, scope: scope, t: &timeline{w: w, start: time.Now()}}, nil
}

func (st *stage) close() { st.reg.close(); removeAll(st.dir) }

// send writes body to the register's scope with l's token; hold, if not
// nil, holds the request back first, like a slow network.
func (st *stage) send(l *demoLease, body string, hold func()) (int, error) {
	var rt http.RoundTripper = httpguard.NewTransport(l, nil)
	if hold != nil {
		rt = delayed{rt, hold}
	}
	req, _ := http.NewRequestWithContext(st.ctx, http.MethodPut, st.reg.srv.URL+"/"+st.scope, strings.NewReader(body))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// verdict says what the register answered a write of pause and delay.
func verdict(code int) string {
	if code == http.StatusConflict {
		return "409 rejected as stale"
	}
	return fmt.Sprintf("%d accepted", code)
}

func playStory(ctx context.Context, w io.Writer, c *client.Client, open func(dir string) (registerStore, error), story string, guarded bool, obs guard.Observer) (bool, error) {
	scope := fmt.Sprintf("demo/%s-%v", story, map[bool]string{true: "guarded", false: "unguarded"}[guarded])
	mode := "guard ON"
	if !guarded {
		mode = "guard OFF"
	}
	st, err := newStage(ctx, w, open, scope, story+" story, "+mode, guarded, obs)
	if err != nil {
		return false, err
	}
	defer st.close()
	t, send, reg := st.t, st.send, st.reg
	const ttl = demoTTL

	la, err := c.Grant(ctx, scope, client.WithTTL(ttl), client.WithHolder("A"))
	if err != nil {
		return false, err
	}
	a := &demoLease{Lease: la}
	t.say("A", "acquires %s -> token %d", scope, la.Token)

	var delayedDone chan int
	if story == "delay" {
		t.say("A", "sends write(%d); the network holds the packet back", la.Token)
		delayedDone = make(chan int, 1)
		go func() {
			code, _ := send(a, "written by A", func() { time.Sleep(2 * ttl) })
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
	code, err := send(&demoLease{Lease: b}, "written by B", nil)
	if err != nil {
		return false, err
	}
	t.say("B", "writes with token %d -> %s", b.Token, verdict(code))

	var stale int
	if story == "delay" {
		stale = <-delayedDone
		t.say("A", "delayed write(%d) arrives -> %s", la.Token, verdict(stale))
	} else {
		stale, err = send(a, "written by A", nil)
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

// playLate plays the late story with the guard on, with a follower of
// the register's marks or without, and returns whether A's late write was
// refused.
func playLate(ctx context.Context, w io.Writer, c *client.Client, open func(dir string) (registerStore, error), followed bool, obs guard.Observer) (bool, error) {
	scope, title := "demo/late-unfollowed", "late story, guard ON, no follower"
	if followed {
		scope, title = "demo/late-followed", "late story, guard ON, with a follower"
	}
	st, err := newStage(ctx, w, open, scope, title, true, obs)
	if err != nil {
		return false, err
	}
	defer st.close()
	t := st.t
	// waitFor polls cond every 5 ms for up to d.
	waitFor := func(d time.Duration, cond func() bool) bool {
		for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return false
			}
		}
		return true
	}

	var f *follow.Follower
	if followed {
		f = follow.New(c, st.store, scope, follow.WithLogger(slog.New(slog.DiscardHandler)))
		fctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Run(fctx) }()
		defer func() { stop(); <-done }()
		// It sees the grant below, and the end, once the service has
		// taken its watch.
		if !waitFor(10*time.Second, func() bool { return f.Position() != 0 }) {
			_, err := f.LastError()
			return false, fmt.Errorf("demo: the follower could not watch %s: %v", scope, err)
		}
		t.say("F", "follows %s: moves the register's mark at each grant and each end of a lease (guard/follow)", scope)
	}

	la, err := c.Grant(ctx, scope, client.WithTTL(demoTTL), client.WithHolder("A"))
	if err != nil {
		return false, err
	}
	a := &demoLease{Lease: la}
	t.say("A", "acquires %s -> token %d", scope, la.Token)
	code, err := st.send(a, "written by A while it held the lease", nil)
	if err != nil {
		return false, err
	}
	t.say("A", "writes with token %d -> %s", la.Token, verdict(code))

	t.say("A", "sends write(%d); the network holds the packet back", la.Token)
	arrive := make(chan struct{})
	delayedDone := make(chan int, 1)
	go func() {
		code, _ := st.send(a, "late write by A", func() { <-arrive })
		delayedDone <- code
	}()
	var closing uint64
	ended := waitFor(30*time.Second, func() bool {
		s, err := c.Get(ctx, scope)
		if err != nil || s.Lease != nil {
			return false
		}
		closing = s.LastToken
		return true
	})
	if !ended {
		close(arrive)
		<-delayedDone
		return false, fmt.Errorf("demo: A's lease of %s did not end within 30s", scope)
	}
	if closing > la.Token {
		t.say("", "A's lease expires; the service closes token %d with token %d, granted to nobody", la.Token, closing)
	} else {
		t.say("", "A's lease expires; the service closes no token (its log format is below 8)")
	}
	if followed {
		if closing > la.Token && waitFor(10*time.Second, func() bool { return st.store.mark(scope) >= closing }) {
			t.say("F", "advances the register's mark for %s to the closing token %d", scope, closing)
		} else {
			t.say("F", "has not advanced the register's mark past %d (lag %s)", st.store.mark(scope), dur(f.Lag()))
		}
	}
	// The packet arrives a moment after the end; nobody else acquired
	// the scope, nobody else wrote.
	time.Sleep(200 * time.Millisecond)
	close(arrive)
	late := <-delayedDone
	if late == http.StatusConflict {
		t.say("A", "delayed write(%d) arrives, nobody else has written -> 409 REFUSED as stale: the register's mark is the closing token %d", la.Token, st.store.mark(scope))
	} else {
		t.say("A", "delayed write(%d) arrives, nobody else has written -> %d ACCEPTED after A's lease expired: the guard has seen no token above %d", la.Token, late, st.store.mark(scope))
	}
	final := st.reg.value(scope)
	fmt.Fprintf(w, "  final value: %q", final)
	if final == "late write by A" {
		fmt.Fprint(w, "  <- THE WINDOW: a write of an expired lease landed")
	}
	fmt.Fprintln(w)
	return late == http.StatusConflict && final != "late write by A", nil
}

// delayed holds a request back before sending it, like a slow network:
// until hold returns.
type delayed struct {
	next http.RoundTripper
	hold func()
}

func (d delayed) RoundTrip(r *http.Request) (*http.Response, error) {
	d.hold()
	return d.next.RoundTrip(r)
}

func tempDir() (string, error) { return os.MkdirTemp("", "fencectl-demo-") }

func removeAll(dir string) { os.RemoveAll(dir) }
