package sqlguard_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/sqlguard"
)

var ctx = context.Background()

var quiet = sqlguard.WithLogger(slog.New(slog.DiscardHandler))

func wr(scope string, token, seq uint64) guard.Write {
	return guard.Write{Token: fence.Token{Scope: scope, Value: token}, Seq: seq}
}

// TestConformance runs guardtest on each database. Reopen closes the
// *sql.DB and opens the same database again, as a restarted service would.
func TestConformance(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		src := newSource(t, d)
		table := src.name(t)
		sources := map[guard.Store]source{}
		open := func(t *testing.T, src source) guard.Store {
			s := newStore(t, src.open(t), d, sqlguard.WithTable(table))
			sources[s] = src
			return s
		}
		guardtest.Run(t, guardtest.Harness{
			Open: func(t *testing.T) guard.Store {
				if d == sqlguard.SQLite {
					return open(t, newSource(t, d)) // a file per subtest
				}
				return open(t, src)
			},
			Reopen: func(t *testing.T, gs guard.Store) guard.Store {
				s := gs.(*sqlguard.Store)
				if err := errors.Join(s.Close(), s.DB().Close()); err != nil {
					t.Fatal(err)
				}
				return open(t, sources[gs])
			},
		})
	})
}

// TestConcurrent has many goroutines present random older and newer
// tokens for three scopes at once, each write setting the scope's value
// and appending to a log in the transaction that advances the mark. Per
// scope, the log must be non-decreasing in token and the value must be
// the write of the highest token presented: invariant 6 under
// interleavings, with the database's own locking.
func TestConcurrent(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		db, name := newDB(t, d, "_value", "_log")
		mustExec(t, db, valueTable(name+"_value"))
		mustExec(t, db, logTable(d, name+"_log"))
		s := newStore(t, db, d, sqlguard.WithTable(name), quiet)
		upsert := upsertValue(d, name+"_value")
		insert := insertLog(d, name+"_log")
		scopes := []string{"orders/1", "orders/2", "orders/3"}
		presented := hammer(t, scopes, func(sc string, v uint64) error {
			return s.Update(ctx, sc, wr(sc, v, 0), func(tx *sql.Tx) error {
				if _, err := tx.Exec(upsert, sc, v, "written by "+strconv.FormatUint(v, 10)); err != nil {
					return err
				}
				_, err := tx.Exec(insert, sc, v)
				return err
			})
		})
		for _, sc := range scopes {
			checkLog(t, db, "SELECT token FROM "+name+"_log WHERE scope = '"+sc+"' ORDER BY id", sc)
			var val string
			if err := db.QueryRow("SELECT val FROM " + name + "_value WHERE scope = '" + sc + "'").Scan(&val); err != nil {
				t.Fatal(err)
			}
			if want := "written by " + strconv.FormatUint(presented[sc], 10); val != want {
				t.Errorf("%s: value %q, want %q", sc, val, want)
			}
			if m, err := s.Highest(ctx, sc); err != nil || m.Token != presented[sc] {
				t.Errorf("%s: mark %+v, %v; want token %d", sc, m, err, presented[sc])
			}
		}
	})
}

// hammer runs random writes with tokens 1 to 100 to scopes from 32
// goroutines, and returns the highest token presented per scope. A write
// may fail only as stale.
func hammer(t *testing.T, scopes []string, write func(scope string, token uint64) error) map[string]uint64 {
	t.Helper()
	const workers, writes = 32, 40
	var (
		mu        sync.Mutex
		presented = map[string]uint64{}
		wg        sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for range writes {
				sc := scopes[rand.IntN(len(scopes))]
				v := 1 + rand.Uint64N(100)
				mu.Lock()
				presented[sc] = max(presented[sc], v)
				mu.Unlock()
				if err := write(sc, v); err != nil && !errors.Is(err, fence.ErrStale) {
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
	return presented
}

// checkLog fails unless the tokens query returns are non-decreasing.
func checkLog(t *testing.T, db *sql.DB, query, what string) {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var log []uint64
	for rows.Next() {
		var v uint64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		if len(log) > 0 && v < log[len(log)-1] {
			t.Fatalf("%s: applied token %d after %d", what, v, log[len(log)-1])
		}
		log = append(log, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(log) == 0 {
		t.Fatalf("%s: no write applied", what)
	}
	t.Logf("%s: %d writes applied", what, len(log))
}

// TestUpdate: fn's writes and the mark commit together; a stale write
// does not run fn; a failing fn rolls its writes and the mark back; the
// greatest token and sequence fit the columns.
func TestUpdate(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		db, name := newDB(t, d, "_value")
		mustExec(t, db, valueTable(name+"_value"))
		s := newStore(t, db, d, sqlguard.WithTable(name), quiet)
		upsert := upsertValue(d, name+"_value")
		put := func(w guard.Write, val string, fail error) error {
			return s.Update(ctx, w.Token.Scope, w, func(tx *sql.Tx) error {
				if _, err := tx.Exec(upsert, w.Token.Scope, w.Token.Value, val); err != nil {
					return err
				}
				return fail
			})
		}
		value := func(sc string) string {
			var v string
			if err := db.QueryRow("SELECT val FROM " + name + "_value WHERE scope = '" + sc + "'").Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		}
		if err := put(wr("a", 42, 0), "from 42", nil); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		if err := put(wr("a", 50, 0), "from 50", boom); !errors.Is(err, boom) {
			t.Fatalf("failing fn = %v, want boom", err)
		}
		if m, _ := s.Highest(ctx, "a"); m.Token != 42 || value("a") != "from 42" {
			t.Fatalf("after a failed write: mark %d, value %q; want 42, from 42", m.Token, value("a"))
		}
		ran := false
		err := s.Update(ctx, "a", wr("a", 41, 0), func(*sql.Tx) error { ran = true; return nil })
		var stale *guard.StaleError
		if ran || !errors.As(err, &stale) || stale.Highest != 42 || stale.Presented != 41 || stale.Scope != "a" {
			t.Fatalf("stale write: fn ran %v, err %v; want a StaleError behind 42", ran, err)
		}

		if err := put(wr("max", fence.MaxToken, math.MaxInt64), "max", nil); err != nil {
			t.Fatal(err)
		}
		if m, _ := s.Highest(ctx, "max"); m != (guard.Mark{Token: fence.MaxToken, Seq: math.MaxInt64}) {
			t.Fatalf("mark %+v, want the greatest token and sequence", m)
		}
		if err := put(wr("max", fence.MaxToken-1, 0), "stale", nil); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("token 2^63-2 after 2^63-1 = %v, want stale", err)
		}
		for _, w := range []guard.Write{wr("a", 0, 0), wr("a", fence.MaxToken+1, 0), wr("a", 43, math.MaxInt64+1), wr("", 1, 0)} {
			if err := put(w, "bad", nil); !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("write %+v = %v, want ErrInvalid", w, err)
			}
		}
		// Scopes compare bytewise, even where MySQL's collations would not.
		if err := put(wr("A", 1, 0), "upper", nil); err != nil {
			t.Fatalf("token 1 of scope A after 42 of a = %v", err)
		}
	})
}

// TestFenceApplyFindsTheTransaction: through guard.Guard, apply's writes
// go into the transaction that advanced the mark and share its fate; a
// token of another scope is refused before anything runs.
func TestFenceApplyFindsTheTransaction(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		db, name := newDB(t, d, "_value")
		mustExec(t, db, valueTable(name+"_value"))
		var buf bytes.Buffer
		g := guard.New(newStore(t, db, d, sqlguard.WithTable(name)), guard.WithLogger(slog.New(slog.NewJSONHandler(&buf, nil))))
		upsert := upsertValue(d, name+"_value")
		write := func(scope string, v uint64, fail error) error {
			return g.Fence(ctx, "k", wr(scope, v, 0), func(ctx context.Context) error {
				tx, ok := sqlguard.TxFromContext(ctx)
				if !ok {
					t.Fatal("apply got no transaction")
				}
				if _, err := tx.ExecContext(ctx, upsert, "k", v, strconv.FormatUint(v, 10)); err != nil {
					return err
				}
				return fail
			})
		}
		if err := write("k", 2, nil); err != nil {
			t.Fatal(err)
		}
		if err := write("k", 3, errors.New("boom")); err == nil {
			t.Fatal("failing apply succeeded")
		}
		if err := write("k", 1, nil); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("token 1 after 2 = %v", err)
		}
		if err := write("other", 9, nil); !errors.Is(err, guard.ErrWrongScope) {
			t.Fatalf("a token of another scope = %v, want ErrWrongScope", err)
		}
		var v string
		if err := db.QueryRow("SELECT val FROM " + name + "_value WHERE scope = 'k'").Scan(&v); err != nil || v != "2" {
			t.Fatalf("stored %q, %v; want 2: the failed write must roll back with its mark", v, err)
		}
		if !bytes.Contains(buf.Bytes(), []byte(`"highest_token":2`)) {
			t.Fatalf("stale rejection not logged: %s", buf.String())
		}
	})
}

func TestNewRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "fence tokens", "t; DROP TABLE x", `"quoted"`, "1abc", "a.b.c", ".a", "a.", "fence_tokens--"} {
		if _, err := sqlguard.New(nil, sqlguard.SQLite, sqlguard.WithTable(name)); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("WithTable(%q) = %v, want ErrInvalid", name, err)
		}
	}
	for _, name := range []string{"fence_tokens", "Fence2", "_t", "fencing.tokens"} {
		if _, err := sqlguard.New(nil, sqlguard.Postgres, sqlguard.WithTable(name)); err != nil {
			t.Errorf("WithTable(%q) = %v", name, err)
		}
	}
	if _, err := sqlguard.New(nil, sqlguard.Postgres, sqlguard.WithTokenColumn("s.fence_token")); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("a qualified token column = %v, want ErrInvalid", err)
	}
	if _, err := sqlguard.New(nil, sqlguard.Dialect(0)); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("dialect 0 = %v, want ErrInvalid", err)
	}
}

// TestSQLiteFenceTableTriggers: SQLite's fence statement tells an accepted
// write from a stale one by its count of changed rows, which must take
// only the statement's own row. Triggers on the fence table that write
// elsewhere (an audit log, say) must neither make a stale write pass nor
// an accepted one fail; nor may an accepted write that rewrites the same
// mark, which changes no byte, look stale.
func TestSQLiteFenceTableTriggers(t *testing.T) {
	db, name := newDB(t, sqlguard.SQLite)
	s := newStore(t, db, sqlguard.SQLite, sqlguard.WithTable(name), quiet)
	audit := name + "_audit"
	mustExec(t, db, "CREATE TABLE "+audit+" (what TEXT NOT NULL, token INTEGER NOT NULL)")
	for _, tr := range []string{
		"CREATE TRIGGER " + name + "_bi BEFORE INSERT ON " + name + " BEGIN INSERT INTO " + audit + " VALUES ('insert', NEW.token), ('insert', NEW.token); END",
		"CREATE TRIGGER " + name + "_au AFTER UPDATE ON " + name + " BEGIN INSERT INTO " + audit + " VALUES ('update', NEW.token); END",
	} {
		mustExec(t, db, tr)
	}
	update := func(w guard.Write) error {
		return s.Update(ctx, w.Token.Scope, w, func(*sql.Tx) error { return nil })
	}
	for _, c := range []struct {
		w     guard.Write
		stale bool
	}{
		{wr("a", 5, 0), false},
		{wr("a", 5, 0), false}, // the same mark again
		{wr("a", 5, 3), false},
		{wr("a", 5, 3), false}, // the same sequence, not strict
		{wr("a", 4, 0), true},  // its BEFORE INSERT trigger writes two rows
		{wr("a", 5, 2), true},
		{wr("a", 6, 0), false},
	} {
		err := update(c.w)
		if stale := errors.Is(err, fence.ErrStale); stale != c.stale || err != nil && !stale {
			t.Fatalf("write %+v = %v, want stale %v", c.w, err, c.stale)
		}
	}
	if m, err := s.Highest(ctx, "a"); err != nil || m != (guard.Mark{Token: 6}) {
		t.Fatalf("mark %+v, %v; want token 6", m, err)
	}
	// A stale write's trigger rows roll back with it; those of token 6, an
	// upsert of an existing row like token 4's, show that the BEFORE
	// INSERT trigger ran for it.
	var inserts, updates int
	err := db.QueryRow("SELECT count(*) FILTER (WHERE what = 'insert'), count(*) FILTER (WHERE what = 'update') FROM "+audit+" WHERE token = 6").Scan(&inserts, &updates)
	if err != nil || inserts != 2 || updates != 1 {
		t.Fatalf("token 6's triggers wrote %d and %d rows (%v), want 2 and 1: the test no longer tries what it says", inserts, updates, err)
	}
}
