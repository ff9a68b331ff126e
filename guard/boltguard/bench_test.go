package boltguard_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
)

// BenchmarkUpdate is a fenced bbolt write beside the same plain write: the
// ratio is the cost of the check (one Get and one Put in the same
// transaction; the fsync dominates both).
func BenchmarkUpdate(b *testing.B) {
	s, err := boltguard.Open(filepath.Join(b.TempDir(), "g.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	put := func(tx *bbolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists([]byte("data"))
		if err != nil {
			return err
		}
		return bk.Put([]byte("k"), []byte("value"))
	}
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			if err := s.DB().Update(put); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fenced", func(b *testing.B) {
		w := guard.Write{Token: fence.Token{Scope: "k", Value: 1}}
		for b.Loop() {
			if err := s.Update(context.Background(), w.Token.Scope, w, false, put); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkUpdateBatch is 64 concurrent fenced writers, each on a scope of
// its own, through Update (a commit each) and through UpdateBatch (the
// writers that come together share a commit). ns/op is per write.
func BenchmarkUpdateBatch(b *testing.B) {
	type update = func(context.Context, string, guard.Write, bool, func(*bbolt.Tx) error) error
	for _, tc := range []struct {
		name   string
		update func(s *boltguard.Store) update
	}{
		{"Update", func(s *boltguard.Store) update { return s.Update }},
		{"UpdateBatch", func(s *boltguard.Store) update { return s.UpdateBatch }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := boltguard.Open(filepath.Join(b.TempDir(), "g.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			update := tc.update(s)
			var next atomic.Int64
			b.SetParallelism(32) // 64 writers on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				scope := fmt.Sprintf("w%d", next.Add(1))
				var tok uint64
				for pb.Next() {
					tok++
					err := update(context.Background(), scope, guard.Write{Token: fence.Token{Scope: scope, Value: tok}}, false, func(tx *bbolt.Tx) error {
						bk, err := tx.CreateBucketIfNotExists([]byte("data"))
						if err != nil {
							return err
						}
						return bk.Put([]byte(scope), []byte("value"))
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
