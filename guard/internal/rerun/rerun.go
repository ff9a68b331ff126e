// Package rerun makes boltguard run batched writes again, for the tests of
// the adapters that must survive it.
package rerun

import (
	"context"
	"errors"
	"sync"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
)

// Force keeps four UpdateBatch calls on s, of scope "failing", whose
// functions always fail, until the returned stop is called. bbolt rolls
// back every batch one of them joins and runs the batch's other calls
// again without it.
func Force(s *boltguard.Store) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				s.UpdateBatch(ctx, "failing", guard.Write{Token: fence.Token{Scope: "failing", Value: 1}}, false,
					func(*bbolt.Tx) error { return errors.New("refused") })
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
