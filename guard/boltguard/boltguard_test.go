package boltguard_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/guardtest"
)

func TestConformance(t *testing.T) {
	paths := map[guard.Store]string{}
	open := func(t *testing.T, path string) *boltguard.Store {
		s, err := boltguard.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		paths[s] = path
		return s
	}
	guardtest.Run(t, guardtest.Harness{
		Open: func(t *testing.T) guard.Store { return open(t, filepath.Join(t.TempDir(), "g.db")) },
		Reopen: func(t *testing.T, s guard.Store) guard.Store {
			if err := s.(*boltguard.Store).Close(); err != nil {
				t.Fatal(err)
			}
			return open(t, paths[s])
		},
	})
}

// TestBatchedConformance: the Batched store keeps the same rule as the
// Store, and is a guard.Repeater.
func TestBatchedConformance(t *testing.T) {
	under := map[guard.Store]*boltguard.Store{}
	paths := map[guard.Store]string{}
	open := func(t *testing.T, path string) guard.Store {
		s, err := boltguard.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		b := s.Batched()
		under[b], paths[b] = s, path
		return b
	}
	guardtest.Run(t, guardtest.Harness{
		Open: func(t *testing.T) guard.Store { return open(t, filepath.Join(t.TempDir(), "g.db")) },
		Reopen: func(t *testing.T, s guard.Store) guard.Store {
			if err := under[s].Close(); err != nil {
				t.Fatal(err)
			}
			return open(t, paths[s])
		},
	})
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !guard.New(s.Batched()).Repeats() || guard.New(s).Repeats() {
		t.Error("want the Batched store, and only it, to say it repeats apply")
	}
}

// TestDataAndMarkCommitTogether: a failed write rolls the mark back with
// it, and an accepted write's data and mark survive a reopen together.
func TestDataAndMarkCommitTogether(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.db")
	s, err := boltguard.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := func(v uint64) guard.Write { return guard.Write{Token: fence.Token{Scope: "orders", Value: v}} }
	put := func(val string) func(tx *bbolt.Tx) error {
		return func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("data"))
			if err != nil {
				return err
			}
			return b.Put([]byte("orders"), []byte(val))
		}
	}
	if err := s.Update(ctx, "orders", w(42), false, put("from 42")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := s.Update(ctx, "orders", w(50), false, func(tx *bbolt.Tx) error { put("from 50")(tx); return boom }); !errors.Is(err, boom) {
		t.Fatalf("failed write = %v", err)
	}
	if m, _ := s.Highest("orders"); m.Token != 42 {
		t.Fatalf("highest after a failed write = %d, want 42", m.Token)
	}
	s.Close()
	s, err = boltguard.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stale *guard.StaleError
	if err := s.Update(ctx, "orders", w(41), false, put("from 41")); !errors.As(err, &stale) || stale.Highest != 42 {
		t.Fatalf("late 41 after reopen = %v, want stale behind 42", err)
	}
	s.DB().View(func(tx *bbolt.Tx) error {
		if got := string(tx.Bucket([]byte("data")).Get([]byte("orders"))); got != "from 42" {
			t.Errorf("stored value %q, want the write of token 42", got)
		}
		return nil
	})
}

// TestSameMarkNotWrittenAgain: a write that leaves its scope's mark as it
// was (the holder's next write under the same token) writes no page for
// the mark: with nothing else to write, its transaction writes what an
// empty one does (bbolt's freelist and meta pages).
func TestSameMarkNotWrittenAgain(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	nothing := func(*bbolt.Tx) error { return nil }
	written := func() int64 {
		st := s.DB().Stats()
		return st.TxStats.GetWrite()
	}
	before := written()
	if err := s.DB().Update(nothing); err != nil {
		t.Fatal(err)
	}
	empty := written() - before
	for _, w := range []guard.Write{
		{Token: fence.Token{Scope: "orders", Value: 7}},
		{Token: fence.Token{Scope: "orders", Value: 7}, Seq: 3},
	} {
		if err := s.Update(ctx, "orders", w, false, nothing); err != nil {
			t.Fatal(err)
		}
		before := written()
		if err := s.Update(ctx, "orders", w, false, nothing); err != nil {
			t.Fatal(err)
		}
		if n := written() - before; n != empty {
			t.Errorf("a second write of token %d seq %d wrote %d pages, want the %d of an empty transaction", w.Token.Value, w.Seq, n, empty)
		}
		if m, _ := s.Highest("orders"); m.Token != 7 || m.Seq != w.Seq {
			t.Errorf("mark after the second write = %+v, want token 7 seq %d", m, w.Seq)
		}
	}
}

// TestFenceApplyWritesInTheSameTransaction: through the guard.Store
// interface, apply finds the transaction and its writes share its fate.
func TestFenceApplyWritesInTheSameTransaction(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := guard.New(s)
	write := func(v uint64, val string, fail error) error {
		return g.Fence(context.Background(), "k", guard.Write{Token: fence.Token{Scope: "k", Value: v}}, func(ctx context.Context) error {
			tx, ok := boltguard.TxFromContext(ctx)
			if !ok {
				t.Fatal("apply got no transaction")
			}
			b, err := tx.CreateBucketIfNotExists([]byte("data"))
			if err != nil {
				return err
			}
			if err := b.Put([]byte("k"), []byte(val)); err != nil {
				return err
			}
			return fail
		})
	}
	if err := write(2, "two", nil); err != nil {
		t.Fatal(err)
	}
	if err := write(3, "three", errors.New("boom")); err == nil {
		t.Fatal("failing apply succeeded")
	}
	if err := write(1, "one", nil); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("token 1 after 2: %v", err)
	}
	s.DB().View(func(tx *bbolt.Tx) error {
		if got := string(tx.Bucket([]byte("data")).Get([]byte("k"))); got != "two" {
			t.Errorf("stored %q, want two: the failed write must roll back with its mark", got)
		}
		return nil
	})
}
