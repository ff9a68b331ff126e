package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard/httpguard"
)

// fenceSetup prepares fence's side of a workload: one client.Client (one
// HTTP/2 connection; to a cluster, given every node, to one node at a
// time, which forwards to the leader if it is not one) shared by the
// workers, as a program would. Every fence
// system runs the same workload; they differ in fenced's flags
// (fencedFlags) or, for fence-single, in the renew call. The client
// coalesces the workers' concurrent Acquire (without wait), Renew and
// Release calls into batch calls, as it does for any program's
// goroutines; etcd's workers likewise share one clientv3.Client, and
// etcd appends the proposals that arrive together with one fsync.
//
//   - lock-cycle: Acquire (a durable grant, keep-alive started) and
//     Release (durable) on the worker's own scope.
//   - contended: the same on one scope with WithWait: the service queues
//     the acquires first come, first served and hands the scope to the next
//     in line on release (Acquire renews before it returns only if the
//     wait took more than a third of the TTL; see client.Acquire).
//   - renew: confirmed renewals of the given number of live leases, each
//     worker renewing its share in turn, renewBatch leases per RenewBatch
//     call (fence) or one per Renew call (fence-single); each lease's
//     renewal is confirmed or refused on its own, and one that is refused
//     counts as an error.
//   - guarded-write-STORE (systems fenced and plain): each worker holds a
//     lease on its own scope and POSTs to the resource (resourceMain) with
//     the lease's token, through httpguard's Transport; the plain resource
//     ignores the token, the fenced one checks it.
//
// renewBatch is how many renewals one renew op confirms, on fence (one
// RenewBatch call) and on etcd (keep-alives pipelined on one stream).
const renewBatch = 100

// renewalsPerOp is how many renewals one op of a renew workload confirms.
func renewalsPerOp(a clientArgs) int64 {
	if a.workload == wlRenew && (a.system == sysFence || a.system == sysEtcd) {
		return renewBatch
	}
	return 1
}

func fenceSetup(ctx context.Context, a clientArgs) ([]op, func(), error) {
	c, err := client.New(a.addr.fence, client.WithHolder("bench"))
	if err != nil {
		return nil, nil, err
	}
	var u undo
	u.add(func() { c.Close() })
	ops := make([]op, a.clients)
	switch {
	case a.workload == wlLockCycle || a.workload == wlContended:
		opts := []client.AcquireOption{client.WithTTL(10 * time.Second)}
		if a.workload == wlContended {
			opts = append(opts, client.WithWait())
		}
		for i := range ops {
			scope := lockKey(a.workload, i)
			ops[i] = func(ctx context.Context) error {
				l, err := c.Acquire(ctx, scope, opts...)
				if err != nil {
					return err
				}
				if a.granted != nil {
					a.granted(l.Token().Value)
				}
				return l.Release(ctx)
			}
		}
	case a.workload == wlRenew:
		leases := make([]fence.Lease, a.leases)
		err := parallel(len(leases), 32, func(i int) error {
			var err error
			leases[i], err = c.Grant(ctx, fmt.Sprintf("renew/%d", i), client.WithTTL(2*time.Minute))
			return err
		})
		if err != nil {
			return u.fail(err)
		}
		// Worker i renews leases i, i+clients, i+2*clients, … in turn,
		// renewBatch at a time.
		for i := range ops {
			var mine []client.Renewal
			for j := i; j < len(leases); j += len(ops) {
				mine = append(mine, client.Renewal{Scope: leases[j].Scope, ID: leases[j].ID})
			}
			if len(mine) == 0 {
				return u.fail(fmt.Errorf("fence: %d leases for %d clients: some would renew nothing", len(leases), len(ops)))
			}
			next := 0
			if a.system == sysFenceSingle {
				ops[i] = func(ctx context.Context) error {
					r := mine[next]
					next = (next + 1) % len(mine)
					_, err := c.Renew(ctx, r.Scope, r.ID)
					return err
				}
				continue
			}
			batch := make([]client.Renewal, renewBatch)
			ops[i] = func(ctx context.Context) error {
				for k := range batch {
					batch[k] = mine[next]
					next = (next + 1) % len(mine)
				}
				rs, err := c.RenewBatch(ctx, batch)
				if err != nil {
					return err
				}
				for _, r := range rs {
					if r.Err != nil {
						return r.Err
					}
				}
				return nil
			}
		}
	case storeOf(a.workload) != "":
		base := http.DefaultTransport.(*http.Transport).Clone()
		base.MaxIdleConnsPerHost = a.clients
		u.add(base.CloseIdleConnections)
		for i := range ops {
			scope := fmt.Sprintf("gw/%d", i)
			l, err := c.Acquire(ctx, scope, client.WithTTL(time.Minute))
			if err != nil {
				return u.fail(err)
			}
			u.add(func() { _ = l.Release(context.Background()) })
			hc := &http.Client{Transport: httpguard.NewTransport(l, base)}
			url := a.addr.resource + "/write/" + scope
			n := 0
			ops[i] = func(ctx context.Context) error {
				n++
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(strconv.Itoa(n)))
				if err != nil {
					return err
				}
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					return fmt.Errorf("guarded write: %s: %s", resp.Status, body)
				}
				return nil
			}
		}
	default:
		return u.fail(fmt.Errorf("fence: no workload %q", a.workload))
	}
	return ops, u.run, nil
}
