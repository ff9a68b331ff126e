package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// etcdSetup prepares etcd's side of a workload: one clientv3.Client (one
// gRPC connection; to a cluster, given every member, one to each, the
// calls spread over them) shared by the workers, each worker with its own
// concurrency.Session (a lease kept alive by the client), as a program
// would.
//
//   - lock-cycle: Mutex.Lock (one Txn: put the waiter key, read the owner)
//     and Mutex.Unlock (one Delete) on the worker's own prefix.
//   - contended: the same on one prefix: each waiter watches the deletion
//     of the key before its own, so the lock passes in creation order.
//   - renew: confirmed keep-alives (LeaseKeepAlive answers with TTL > 0) of
//     the given number of leases, each worker renewing its share in turn on
//     a keep-alive stream of its own, pipelined: an op confirms renewBatch
//     renewals, the same work per op as fence's RenewBatch, keeping up to
//     -etcd-window keep-alives in flight on the stream (sending the next as
//     each answer arrives; the server answers a stream's requests in
//     order). The protocol carries one lease per message.
func etcdSetup(ctx context.Context, a clientArgs) ([]op, func(), error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: strings.Split(a.addr.etcd, ","), DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, nil, err
	}
	var u undo
	u.add(func() { cli.Close() })
	ops := make([]op, a.clients)
	mutex := func(prefix string) (*concurrency.Mutex, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(60), concurrency.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		u.add(func() { s.Close() })
		return concurrency.NewMutex(s, prefix), nil
	}
	switch a.workload {
	case wlLockCycle, wlContended:
		for i := range ops {
			m, err := mutex(lockKey(a.workload, i))
			if err != nil {
				return u.fail(err)
			}
			ops[i] = func(ctx context.Context) error {
				if err := m.Lock(ctx); err != nil {
					return err
				}
				if a.granted != nil {
					a.granted(m.Header().RaftTerm)
				}
				return m.Unlock(ctx)
			}
		}
	case wlRenew:
		ids := make([]clientv3.LeaseID, a.leases)
		err := parallel(len(ids), 32, func(i int) error {
			g, err := cli.Grant(ctx, 120)
			if err == nil {
				ids[i] = g.ID
			}
			return err
		})
		if err != nil {
			return u.fail(err)
		}
		lc := pb.NewLeaseClient(cli.ActiveConnection())
		sctx, cancel := context.WithCancel(ctx)
		u.add(cancel)
		for i := range ops {
			stream, err := lc.LeaseKeepAlive(sctx)
			if err != nil {
				return u.fail(err)
			}
			var mine []clientv3.LeaseID
			for j := i; j < len(ids); j += len(ops) {
				mine = append(mine, ids[j])
			}
			next := 0
			window := min(max(a.etcdWindow, 1), renewBatch)
			ops[i] = func(context.Context) error {
				send := func() error {
					err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(mine[next])})
					next = (next + 1) % len(mine)
					return err
				}
				for range window {
					if err := send(); err != nil {
						return err
					}
				}
				for k := range renewBatch {
					resp, err := stream.Recv()
					if err != nil {
						return err
					}
					if resp.TTL <= 0 {
						return fmt.Errorf("lease %x: not renewed (TTL %d)", resp.ID, resp.TTL)
					}
					if k+window < renewBatch {
						if err := send(); err != nil {
							return err
						}
					}
				}
				return nil
			}
		}
	default:
		return u.fail(fmt.Errorf("etcd: no workload %q", a.workload))
	}
	return ops, u.run, nil
}
