// Package boltguard keeps the highest accepted fencing tokens in a bbolt
// file, for custom services that keep their data there too: the token check
// and the service's writes commit in one bbolt transaction, so a restart of
// the service cannot forget a token it accepted.
//
// # Usage
//
//	s, err := boltguard.Open("data.db")
//	err = s.Update(ctx, "orders", guard.Write{Token: tok}, false, func(tx *bbolt.Tx) error {
//		return tx.Bucket([]byte("orders")).Put(key, value)
//	})
//
// # Caveats
//
// bbolt has one writer at a time, so fenced writes to every scope of one
// file are serialised, each Update with its own fsync. Many concurrent
// writers should use UpdateBatch, which commits them together; behind
// httpguard or grpcguard's unary interceptor, give the guard the Batched
// store for the same effect, and the adapter its WithRepeats option to
// say that the handlers allow being run again. The marks live in the bucket named by Bucket;
// do not write to it.
package boltguard

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// Bucket holds one 16-byte mark (token, sequence; big-endian) per scope.
const Bucket = "fence_tokens"

// Store is a guard.Store over a bbolt database. It is safe for concurrent
// use.
type Store struct {
	db    *bbolt.DB
	owned bool // Close closes db
}

// Open opens (creating if needed) the bbolt file at path.
func Open(path string) (*Store, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("boltguard: open %s: %w", path, err)
	}
	// UpdateBatch's batches: bbolt's 10ms wait would cost a lone writer far
	// more than the commit it shares (an fsync, 0.1-1ms); and a batch of 32
	// commits at once, so that the next fills while it commits. Measured
	// with 64 writers (bench/): 1ms and 32 gave 26,800 writes/s; 1ms and
	// 1000 (bbolt's), 22,900; 250µs, 17,300; 2ms, 17,200; 1ms and 16, 22,700.
	db.MaxBatchDelay = time.Millisecond
	db.MaxBatchSize = 32
	s, err := New(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// New uses an open database, so the guarded data and the marks share its
// transactions. Close does not close db.
func New(db *bbolt.DB) (*Store, error) {
	err := db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte(Bucket))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("boltguard: create bucket: %w", err)
	}
	return &Store{db: db}, nil
}

// DB returns the underlying database.
func (s *Store) DB() *bbolt.DB { return s.db }

// Close closes the database if Open opened it.
func (s *Store) Close() error {
	if s.owned {
		return s.db.Close()
	}
	return nil
}

// Update runs fn in a read-write transaction after checking w against its
// scope's highest mark and advancing it: a stale w returns a
// *guard.StaleError and fn does not run; if fn fails, the transaction and
// with it the mark roll back.
//
// scope is the scope fn writes: a token of another scope is refused
// (guard.ErrWrongScope), so a token granted for one resource cannot pass
// for another's. A token of no scope, or with a value outside 1 to
// fence.MaxToken, is refused as invalid (fence.ErrInvalid) before the file
// is touched. Update does not verify signatures: use a guard.Guard with
// guard.WithVerifier over the Store for that.
func (s *Store) Update(ctx context.Context, scope string, w guard.Write, strict bool, fn func(tx *bbolt.Tx) error) error {
	if err := validate(ctx, scope, w); err != nil {
		return err
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
		if err := advance(tx, w, strict); err != nil {
			return err
		}
		return fn(tx)
	})
}

// UpdateBatch is Update for many concurrent writers: the calls that come
// within the database's MaxBatchDelay, up to its MaxBatchSize, share one
// transaction and one commit (bbolt's DB.Batch), so one fsync serves them
// all. Open sets 1ms and 32; a lone call waits that long for company. A
// stale write is refused on its own and does not hold the others back.
//
// fn may run more than once: when one call's fn fails, bbolt rolls the
// shared transaction back, runs that call alone and the others again. So fn
// must change nothing but tx. The call run alone checks w again, and a
// newer token committed in between makes it stale: UpdateBatch then
// returns the *guard.StaleError, whatever fn returned before.
func (s *Store) UpdateBatch(ctx context.Context, scope string, w guard.Write, strict bool, fn func(tx *bbolt.Tx) error) error {
	if err := validate(ctx, scope, w); err != nil {
		return err
	}
	var refused error
	err := s.db.Batch(func(tx *bbolt.Tx) error {
		refused = nil
		err := advance(tx, w, strict)
		var stale *guard.StaleError
		if errors.As(err, &stale) {
			refused = err // nothing was written: the batch goes on
			return nil
		}
		if err != nil {
			return err
		}
		return fn(tx)
	})
	if err != nil {
		return err
	}
	return refused
}

// advance checks w against its scope's highest mark in tx and, unless it
// is stale, records it as the new highest. A mark that w leaves as it was,
// the holder's next write under the same token, is not written again:
// bbolt would copy its page out at the commit all the same.
func advance(tx *bbolt.Tx, w guard.Write, strict bool) error {
	b := tx.Bucket([]byte(Bucket))
	if b == nil {
		return errors.New("boltguard: the fence_tokens bucket is missing")
	}
	key := []byte(w.Token.Scope)
	highest, err := decode(b.Get(key))
	if err != nil {
		return fmt.Errorf("boltguard: scope %q: %w", w.Token.Scope, err)
	}
	if err := guard.Check(w.Token.Scope, highest, w, strict); err != nil {
		return err
	}
	next := guard.Next(highest, w)
	if next == highest {
		return nil
	}
	return b.Put(key, encode(next))
}

// validate refuses, before the file is touched, a call already cancelled,
// a token of another scope, and a write no service could have issued. A
// guard.Guard checks the token already, but Update and UpdateBatch are
// also called directly, and a value above fence.MaxToken, once recorded,
// would refuse every later writer of the scope.
func validate(ctx context.Context, scope string, w guard.Write) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.Token.Scope != scope {
		return fmt.Errorf("%w: %s presented for scope %q", guard.ErrWrongScope, w.Token, scope)
	}
	if w.Token.Scope == "" {
		return &fence.InvalidError{Field: "scope", Reason: "the write's token has no scope"}
	}
	if w.Token.Value == 0 || w.Token.Value > fence.MaxToken {
		return &fence.InvalidError{Field: "token", Reason: fmt.Sprintf("value %d is outside 1 to %d", w.Token.Value, uint64(fence.MaxToken))}
	}
	return nil
}

// Fence implements guard.Store: apply runs inside the transaction that
// advances the mark, and finds it with TxFromContext to make its writes
// there. (Opening another read-write transaction of the same database
// inside apply would deadlock: bbolt has one writer at a time.)
func (s *Store) Fence(ctx context.Context, w guard.Write, strict bool, apply func(ctx context.Context) error) error {
	return s.Update(ctx, w.Token.Scope, w, strict, func(tx *bbolt.Tx) error {
		return apply(context.WithValue(ctx, txKey{}, tx))
	})
}

// Batched returns the Store as a guard.Store whose Fence commits
// concurrent writes together, through UpdateBatch. Its apply may run more
// than once, and only its last run's writes to the transaction are kept:
// apply must change nothing but the transaction, and answer nothing until
// Fence has returned. It is a guard.Repeater, which httpguard and
// grpcguard's unary interceptor accept only with their WithRepeats option,
// and then prepare their handlers for; a gRPC stream cannot be fenced over
// it.
func (s *Store) Batched() guard.Store { return batched{s} }

type batched struct{ s *Store }

func (b batched) Fence(ctx context.Context, w guard.Write, strict bool, apply func(ctx context.Context) error) error {
	return b.s.UpdateBatch(ctx, w.Token.Scope, w, strict, func(tx *bbolt.Tx) error {
		return apply(context.WithValue(ctx, txKey{}, tx))
	})
}

func (batched) RepeatsApply() bool { return true }

func (b batched) Scopes(ctx context.Context, prefix string) ([]string, error) {
	return b.s.Scopes(ctx, prefix)
}

// Scopes implements guard.Lister: the scopes starting with prefix that
// have a mark, in byte order.
func (s *Store) Scopes(ctx context.Context, prefix string) ([]string, error) {
	var scopes []string
	err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket([]byte(Bucket)).Cursor()
		for k, _ := c.Seek([]byte(prefix)); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, _ = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			scopes = append(scopes, string(k))
		}
		return nil
	})
	return scopes, err
}

type txKey struct{}

// TxFromContext returns the read-write transaction of the Fence call whose
// apply received ctx: writes made in it commit, or roll back, together
// with the fencing mark.
func TxFromContext(ctx context.Context) (*bbolt.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*bbolt.Tx)
	return tx, ok
}

// Highest returns the highest mark accepted for scope.
func (s *Store) Highest(scope string) (guard.Mark, error) {
	var m guard.Mark
	err := s.db.View(func(tx *bbolt.Tx) error {
		var err error
		m, err = decode(tx.Bucket([]byte(Bucket)).Get([]byte(scope)))
		return err
	})
	return m, err
}

func encode(m guard.Mark) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, m.Token)
	binary.BigEndian.PutUint64(b[8:], m.Seq)
	return b
}

func decode(b []byte) (guard.Mark, error) {
	switch len(b) {
	case 0:
		return guard.Mark{}, nil
	case 16:
		return guard.Mark{Token: binary.BigEndian.Uint64(b), Seq: binary.BigEndian.Uint64(b[8:])}, nil
	}
	return guard.Mark{}, fmt.Errorf("corrupt mark of %d bytes", len(b))
}
