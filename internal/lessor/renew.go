package lessor

import (
	"context"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// Renewal names a lease to renew.
type Renewal struct {
	Scope string
	ID    fence.LeaseID
}

// Renewed is what RenewBatch decides for one lease: the lease as checked
// (or why not), and its TTL if renewed.
type Renewed struct {
	fsm.Result
	TTL time.Duration
}

// renewChunk bounds the renewals made under one hold of the locks, so that
// a large batch does not hold the state machine's writer back for long.
const renewChunk = 128

// RenewBatch moves each lease's deadline a full TTL ahead if its ID is the
// scope's current lease and its expiry has not been decided, taking the
// locks once for many of them, and answers rs[i] in out[i] (out is as long
// as rs; the caller's, so that it can reuse it). If it renewed any, it then
// confirms that this node still leads (Node.ConfirmLeader) and returns its
// error if it cannot: then none of the renewals may be confirmed to its
// holder, since a new leader counts the TTL from its own start, not from
// this renewal. A refusal in out stands either way.
func (l *Lessor) RenewBatch(ctx context.Context, rs []Renewal, out []Renewed) error {
	renewed := false
	for start := 0; start < len(rs); start += renewChunk {
		end := min(start+renewChunk, len(rs))
		// The state lock first, then the deadlines': see the lock order.
		l.node.Read(func(st *fsm.State) {
			renewed = l.deadlines.renew(time.Now(), rs[start:end], out[start:end], func(r Renewal) fsm.Result { return st.Check(r.Scope, r.ID) }) || renewed
		})
	}
	if !renewed {
		return nil
	}
	return l.node.ConfirmLeader(ctx)
}
