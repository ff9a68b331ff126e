package boltguard_test

import (
	"context"
	"path/filepath"
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
