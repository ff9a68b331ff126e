package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

// BenchmarkAcquireRelease measures a lock cycle (a durable grant, then a
// durable release) through a real server on loopback, on distinct scopes,
// with 1, 16 and 64 concurrent clients. ns/op is per cycle, all clients
// together.
func BenchmarkAcquireRelease(b *testing.B) {
	benchClients(b, func(c *client.Client, scope string) func() error {
		ctx := context.Background()
		return func() error {
			l, err := c.Grant(ctx, scope, client.WithTTL(10*time.Second))
			if err != nil {
				return err
			}
			_, err = c.Release(ctx, scope, l.ID)
			return err
		}
	})
}

// BenchmarkRenew measures renewals of held leases through a real server on
// loopback. Renewals stay off the Raft log.
func BenchmarkRenew(b *testing.B) {
	benchClients(b, func(c *client.Client, scope string) func() error {
		ctx := context.Background()
		l, err := c.Grant(ctx, scope, client.WithTTL(time.Minute))
		if err != nil {
			return func() error { return err }
		}
		return func() error {
			_, err := c.Renew(ctx, scope, l.ID)
			return err
		}
	})
}

// benchClients runs b.N operations spread over n concurrent clients, for n
// in 1, 16 and 64, against one fresh server each. setup prepares one
// client's operation on its own scope.
func benchClients(b *testing.B, setup func(c *client.Client, scope string) func() error) {
	for _, n := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
			srv := fencetest.NewServer()
			defer srv.Close()
			c := srv.Client()
			defer c.Close()
			ops := make([]func() error, n)
			for i := range ops {
				ops[i] = setup(c, fmt.Sprintf("bench/%d", i))
			}
			b.ResetTimer()
			var wg sync.WaitGroup
			for i, op := range ops {
				count := b.N / n
				if i < b.N%n {
					count++
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range count {
						if err := op(); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// BenchmarkRenewBatch measures renewals sent 100 to a call, as the leases
// of one client send them, by 16 concurrent callers, with signed tokens
// (fenced's default). ns/op is per renewal.
func BenchmarkRenewBatch(b *testing.B) {
	const callers, per = 16, 100
	srv := fencetest.NewServer(fencetest.WithSigning())
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	batches := make([][]client.Renewal, callers)
	for i := range batches {
		for j := range per {
			scope := fmt.Sprintf("bench/%d/%d", i, j)
			l, err := c.Grant(ctx, scope, client.WithTTL(time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			batches[i] = append(batches[i], client.Renewal{Scope: scope, ID: l.ID})
		}
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	calls := (b.N + per - 1) / per
	for i, batch := range batches {
		count := calls / callers
		if i < calls%callers {
			count++
		}
		wg.Go(func() {
			for range count {
				rs, err := c.RenewBatch(ctx, batch)
				if err == nil {
					err = rs[0].Err
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
