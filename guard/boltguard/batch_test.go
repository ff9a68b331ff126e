package boltguard_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
)

// TestUpdateBatchConcurrent: 64 writers present random older and newer
// tokens for four scopes at once through UpdateBatch. Every accepted write
// is committed, in token order per scope (a log written in the same
// transactions says so), each stale one is refused with the highest token
// it lost to, and each scope ends with the write of its highest token.
func TestUpdateBatchConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.db")
	s, err := boltguard.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	scopes := []string{"a", "b", "c", "d"}
	var mu sync.Mutex
	accepted := map[string]int{}
	highest := map[string]uint64{}
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 40 {
				scope := scopes[rng.IntN(len(scopes))]
				tok := 1 + rng.Uint64N(200)
				err := s.UpdateBatch(context.Background(), scope, guard.Write{Token: fence.Token{Scope: scope, Value: tok}}, false, func(tx *bbolt.Tx) error {
					data, err := tx.CreateBucketIfNotExists([]byte("data"))
					if err != nil {
						return err
					}
					log, err := tx.CreateBucketIfNotExists([]byte("log/" + scope))
					if err != nil {
						return err
					}
					seq, _ := log.NextSequence()
					if err := log.Put(binary.BigEndian.AppendUint64(nil, seq), binary.BigEndian.AppendUint64(nil, tok)); err != nil {
						return err
					}
					return data.Put([]byte(scope), binary.BigEndian.AppendUint64(nil, tok))
				})
				var stale *guard.StaleError
				switch {
				case err == nil:
					mu.Lock()
					accepted[scope]++
					highest[scope] = max(highest[scope], tok)
					mu.Unlock()
				case errors.As(err, &stale):
					if stale.Presented != tok || stale.Highest <= tok {
						t.Errorf("%s: token %d refused as %v", scope, tok, err)
					}
				default:
					t.Errorf("%s: token %d: %v", scope, tok, err)
				}
			}
		})
	}
	wg.Wait()
	err = s.DB().View(func(tx *bbolt.Tx) error {
		for _, scope := range scopes {
			var last uint64
			n := 0
			c := tx.Bucket([]byte("log/" + scope)).Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				tok := binary.BigEndian.Uint64(v)
				if tok < last {
					return fmt.Errorf("%s: token %d committed after %d", scope, tok, last)
				}
				last, n = tok, n+1
			}
			if n != accepted[scope] {
				return fmt.Errorf("%s: %d writes committed, %d accepted", scope, n, accepted[scope])
			}
			if got := binary.BigEndian.Uint64(tx.Bucket([]byte("data")).Get([]byte(scope))); got != highest[scope] || last != highest[scope] {
				return fmt.Errorf("%s holds the write of %d (log ends at %d); the highest accepted was %d", scope, got, last, highest[scope])
			}
			m, _ := s.Highest(scope)
			if m.Token != highest[scope] {
				return fmt.Errorf("%s: mark %d, highest accepted %d", scope, m.Token, highest[scope])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestUpdateBatchFailureIsItsOwn: a call whose fn fails rolls back its own
// mark and writes, while the calls batched with it commit.
func TestUpdateBatchFailureIsItsOwn(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	boom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make([]error, 32)
	for i := range errs {
		wg.Go(func() {
			scope := fmt.Sprintf("s%d", i)
			errs[i] = s.UpdateBatch(context.Background(), scope, guard.Write{Token: fence.Token{Scope: scope, Value: 5}}, false, func(tx *bbolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("data"))
				if err != nil {
					return err
				}
				if err := b.Put([]byte(scope), []byte("x")); err != nil {
					return err
				}
				if i%4 == 0 {
					return boom
				}
				return nil
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		scope := fmt.Sprintf("s%d", i)
		m, _ := s.Highest(scope)
		var data []byte
		s.DB().View(func(tx *bbolt.Tx) error {
			if b := tx.Bucket([]byte("data")); b != nil {
				data = b.Get([]byte(scope))
			}
			return nil
		})
		switch {
		case i%4 == 0 && (!errors.Is(err, boom) || m.Token != 0 || data != nil):
			t.Errorf("%s: %v, mark %d, data %q; want boom and nothing kept", scope, err, m.Token, data)
		case i%4 != 0 && (err != nil || m.Token != 5 || string(data) != "x"):
			t.Errorf("%s: %v, mark %d, data %q; want committed", scope, err, m.Token, data)
		}
	}
	// Bad input is refused before the file is touched, as by Update.
	if err := s.UpdateBatch(context.Background(), "a", guard.Write{Token: fence.Token{Scope: "b", Value: 1}}, false, nil); !errors.Is(err, guard.ErrWrongScope) {
		t.Errorf("a token of b at a: %v", err)
	}
	if err := s.UpdateBatch(context.Background(), "a", guard.Write{Token: fence.Token{Scope: "a"}}, false, nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("token 0: %v", err)
	}
}
