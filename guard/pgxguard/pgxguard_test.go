package pgxguard_test

import (
	"database/sql"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/pgxguard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// TestConformance runs guardtest over Fence. Reopen closes the pool and
// opens a new one on the same database, as a restarted service would.
func TestConformance(t *testing.T) {
	shared, table := newPool(t)
	d := dsn(t)
	open := func(t *testing.T) guard.Store {
		pool := open(t, d)
		t.Cleanup(pool.Close)
		return newStore(t, pool, table)
	}
	newStore(t, shared, table) // create the table once, before the subtests race to
	guardtest.Run(t, guardtest.Harness{
		Open: open,
		Reopen: func(t *testing.T, s guard.Store) guard.Store {
			return open(t) // the old pool is closed by its own cleanup
		},
	})
}

// write is a fenced write by Update or by Send: it sets the scope's value
// and appends to the log, in the transaction that advances the mark.
type write func(s *pgxguard.Store, name, scope string, token uint64) error

var writes = map[string]write{
	"Update": func(s *pgxguard.Store, name, sc string, v uint64) error {
		return s.Update(ctx, sc, wr(sc, v, 0), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsert(name), sc, v, "written by "+strconv.FormatUint(v, 10)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+name+"_log (scope, token) VALUES ($1, $2)", sc, v)
			return err
		})
	},
	"Send": func(s *pgxguard.Store, name, sc string, v uint64) error {
		b := &pgx.Batch{}
		b.Queue(upsert(name), sc, v, "written by "+strconv.FormatUint(v, 10))
		b.Queue("INSERT INTO "+name+"_log (scope, token) VALUES ($1, $2)", sc, v)
		return s.Send(ctx, sc, wr(sc, v, 0), b)
	},
}

// valueTable creates table_value, one value per scope, which upsert sets.
func valueTable(t testing.TB, pool *pgxpool.Pool, table string) {
	t.Helper()
	mustExec(t, pool, "CREATE TABLE "+table+"_value (scope VARCHAR(256) PRIMARY KEY, token BIGINT NOT NULL, val VARCHAR(64) NOT NULL)")
}

func upsert(name string) string {
	return "INSERT INTO " + name + "_value (scope, token, val) VALUES ($1, $2, $3) ON CONFLICT (scope) DO UPDATE SET token = excluded.token, val = excluded.val"
}

// TestConcurrent has 32 goroutines present random older and newer tokens
// for three scopes at once, through Update and through Send. Per scope,
// the log of applied writes must be non-decreasing in token, and the
// value and the mark must be those of the highest token presented.
func TestConcurrent(t *testing.T) {
	for name, write := range writes {
		t.Run(name, func(t *testing.T) {
			pool, table := newPool(t, "_value", "_log")
			valueTable(t, pool, table)
			mustExec(t, pool, "CREATE TABLE "+table+"_log (id bigserial PRIMARY KEY, scope VARCHAR(256) NOT NULL, token BIGINT NOT NULL)")
			s := newStore(t, pool, table, quiet)
			scopes := []string{"orders/1", "orders/2", "orders/3"}
			var (
				mu        sync.Mutex
				presented = map[string]uint64{}
				wg        sync.WaitGroup
			)
			for range 32 {
				wg.Go(func() {
					for range 40 {
						sc := scopes[rand.IntN(len(scopes))]
						v := 1 + rand.Uint64N(100)
						mu.Lock()
						presented[sc] = max(presented[sc], v)
						mu.Unlock()
						if err := write(s, table, sc, v); err != nil && !errors.Is(err, fence.ErrStale) {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			for _, sc := range scopes {
				rows, err := pool.Query(ctx, "SELECT token FROM "+table+"_log WHERE scope = $1 ORDER BY id", sc)
				if err != nil {
					t.Fatal(err)
				}
				log, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				if err != nil || len(log) == 0 {
					t.Fatalf("%s: log %v, %v; want writes", sc, log, err)
				}
				for i := 1; i < len(log); i++ {
					if log[i] < log[i-1] {
						t.Fatalf("%s: applied token %d after %d", sc, log[i], log[i-1])
					}
				}
				var val string
				if err := pool.QueryRow(ctx, "SELECT val FROM "+table+"_value WHERE scope = $1", sc).Scan(&val); err != nil {
					t.Fatal(err)
				}
				if want := "written by " + strconv.FormatUint(presented[sc], 10); val != want {
					t.Errorf("%s: value %q, want %q", sc, val, want)
				}
				if m, err := s.Highest(ctx, sc); err != nil || m.Token != presented[sc] {
					t.Errorf("%s: mark %+v, %v; want token %d", sc, m, err, presented[sc])
				}
				t.Logf("%s: %d writes applied", sc, len(log))
			}
		})
	}
}

// TestSendMatchesCheck runs guardtest.MatchesCheck through Send, which
// the conformance suite, over Fence, does not reach.
func TestSendMatchesCheck(t *testing.T) {
	pool, table := newPool(t)
	stores := [2]*pgxguard.Store{newStore(t, pool, table, quiet), newStore(t, pool, table, quiet, guard.WithStrictSequence())}
	guardtest.MatchesCheck(t, func(w guard.Write, strict bool) error {
		s := stores[0]
		if strict {
			s = stores[1]
		}
		return s.Send(ctx, w.Token.Scope, w, &pgx.Batch{})
	})
}

// TestSend: a stale Send writes nothing and runs no callback; an accepted
// one runs them all; if one of the batch's statements fails, the mark
// does not move either.
func TestSend(t *testing.T) {
	pool, table := newPool(t, "_log")
	mustExec(t, pool, "CREATE TABLE "+table+"_log (scope VARCHAR(256) NOT NULL, token BIGINT NOT NULL CHECK (token < 1000))")
	s := newStore(t, pool, table, quiet)
	logged := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+"_log").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	send := func(token uint64, logToken int) (calls int, err error) {
		b := &pgx.Batch{}
		b.Queue("INSERT INTO "+table+"_log (scope, token) VALUES ('orders', $1)", logToken).Exec(func(pgconn.CommandTag) error {
			calls++
			return nil
		})
		return calls, s.Send(ctx, "orders", wr("orders", token, 0), b)
	}
	if calls, err := send(42, 42); err != nil || calls != 1 || logged() != 1 {
		t.Fatalf("token 42: %v, %d callbacks, %d rows; want accepted, 1, 1", err, calls, logged())
	}
	calls, err := send(41, 41)
	var stale *guard.StaleError
	if !errors.As(err, &stale) || stale.Presented != 41 || stale.Highest != 42 || calls != 0 || logged() != 1 {
		t.Fatalf("token 41 after 42: %v, %d callbacks, %d rows; want superseded by 42, 0, 1", err, calls, logged())
	}
	// 1000 breaks the log's CHECK: the batch fails after the fence
	// statement accepted 50, and the mark rolls back with it.
	if _, err := send(50, 1000); err == nil || errors.Is(err, fence.ErrStale) {
		t.Fatalf("failing batch: %v, want the CHECK violation", err)
	}
	if m, err := s.Highest(ctx, "orders"); err != nil || m.Token != 42 || logged() != 1 {
		t.Fatalf("after a failed batch: mark %+v, %v, %d rows; want 42, 1 row", m, err, logged())
	}
}

// TestUpdateFailureRollsBack: a failing fn rolls its writes back with the
// mark, and Update returns fn's error; fn does not run for a stale write.
func TestUpdateFailureRollsBack(t *testing.T) {
	pool, table := newPool(t, "_log")
	mustExec(t, pool, "CREATE TABLE "+table+"_log (token BIGINT NOT NULL)")
	s := newStore(t, pool, table, quiet)
	boom := errors.New("boom")
	err := s.Update(ctx, "orders", wr("orders", 7, 0), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+"_log VALUES (7)"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failing fn: %v, want boom", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+"_log").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after the failed write: %d, %v; want 0", n, err)
	}
	if m, err := s.Highest(ctx, "orders"); err != nil || m.Token != 0 {
		t.Fatalf("mark after the failed write: %+v, %v; want none", m, err)
	}
	if err := s.Update(ctx, "orders", wr("orders", 9, 0), func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ran := false
	err = s.Update(ctx, "orders", wr("orders", 8, 0), func(pgx.Tx) error { ran = true; return nil })
	if !errors.Is(err, fence.ErrStale) || ran {
		t.Fatalf("stale write: %v, fn ran %v; want stale, not run", err, ran)
	}
}

// TestSharesSqlguardTable: a sqlguard.Store and a pgxguard.Store on one
// table fence the same scopes, each refusing what the other superseded.
func TestSharesSqlguardTable(t *testing.T) {
	pool, table := newPool(t)
	db, err := sql.Open("pgx", dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ss, err := sqlguard.New(db, sqlguard.Postgres, sqlguard.WithTable(table), sqlguard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	if err := ss.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	ps := newStore(t, pool, table, quiet)
	viaSQL := func(v uint64) error {
		return ss.Update(ctx, "orders", wr("orders", v, 0), func(*sql.Tx) error { return nil })
	}
	viaPgx := func(v uint64) error { return ps.Send(ctx, "orders", wr("orders", v, 0), &pgx.Batch{}) }
	for _, step := range []struct {
		name  string
		write func(uint64) error
		token uint64
		stale bool
	}{
		{"sqlguard 42", viaSQL, 42, false},
		{"pgxguard 41", viaPgx, 41, true},
		{"pgxguard 50", viaPgx, 50, false},
		{"sqlguard 49", viaSQL, 49, true},
		{"sqlguard 50", viaSQL, 50, false},
	} {
		if err := step.write(step.token); errors.Is(err, fence.ErrStale) != step.stale || (err != nil) != step.stale {
			t.Fatalf("%s: %v, want stale %v", step.name, err, step.stale)
		}
	}
}

// TestBadInput: what the table cannot hold, a token of another scope and a
// bad table name are refused with a clear error, and the mark stays.
func TestBadInput(t *testing.T) {
	pool, table := newPool(t)
	for _, name := range []string{"bad table", "x;drop", "a.b.c"} {
		if _, err := pgxguard.New(pool, name); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("New with table %q: %v, want an invalid-name error", name, err)
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := pgxguard.New(tx, ""); err == nil {
		t.Error("New over a pgx.Tx: accepted, want an error")
	}
	s := newStore(t, pool, table, quiet)
	if err := s.Send(ctx, "orders", wr("orders", 5, 0), &pgx.Batch{}); err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]guard.Write{
		"token 0":             wr("orders", 0, 0),
		"token over MaxToken": wr("orders", fence.MaxToken+1, 0),
		"sequence over 2^63":  wr("orders", 6, math.MaxInt64+1),
		"another scope":       wr("billing", 6, 0),
	} {
		for how, err := range map[string]error{
			"Update": s.Update(ctx, "orders", w, func(pgx.Tx) error { return nil }),
			"Send":   s.Send(ctx, "orders", w, &pgx.Batch{}),
		} {
			if err == nil || errors.Is(err, fence.ErrStale) {
				t.Errorf("%s by %s: %v, want refused as invalid", name, how, err)
			}
		}
	}
	if m, err := s.Highest(ctx, "orders"); err != nil || m.Token != 5 {
		t.Fatalf("mark after bad input: %+v, %v; want 5", m, err)
	}
}
