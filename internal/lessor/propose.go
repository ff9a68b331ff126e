package lessor

import (
	"context"
	"fmt"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// Acquire proposes an acquire command, stamped and validated by the caller,
// and, if it waits, follows it through its life (see the package doc) until
// it is granted, refused, or ctx is done, in which case it withdraws from
// the line. The result's outcome is the command's, or Granted after a wait.
func (l *Lessor) Acquire(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	done, err := l.admit(c)
	if err != nil {
		return fsm.Result{}, err
	}
	defer done()
	if !c.Wait {
		return l.proposeOne(ctx, c)
	}
	return l.wait(ctx, c)
}

// Release proposes the release of the scope's lease with this ID.
func (l *Lessor) Release(ctx context.Context, scope string, id fence.LeaseID) (fsm.Result, error) {
	return l.proposeOne(ctx, fsm.Command{Op: fsm.OpRelease, Scope: scope, LeaseID: id, At: time.Now().UnixNano()})
}

// Batch proposes acquires without wait and releases, stamped and validated
// by the caller, and returns their results in the order of cs. Once the
// cluster's log format has fsm.OpBatch they are one log entry; before, one
// entry each, in order, so they apply as the batch would. An error means
// the outcome of every command is unknown.
func (l *Lessor) Batch(ctx context.Context, cs []fsm.Command) ([]fsm.Result, error) {
	// An acquire Admit refuses is answered Invalid with Admit's error, and
	// the others are proposed without it.
	out := make([]fsm.Result, len(cs))
	admitted := make([]fsm.Command, 0, len(cs))
	at := make([]int, 0, len(cs)) // admitted[j] is cs[at[j]]
	var dones []func()
	defer func() {
		for _, done := range dones {
			done()
		}
	}()
	for i, c := range cs {
		if c.Op == fsm.OpAcquire {
			done, err := l.admit(c)
			if err != nil {
				out[i] = fsm.Result{Outcome: fsm.Invalid, Scope: c.Scope, Err: err}
				continue
			}
			dones = append(dones, done)
		}
		admitted = append(admitted, c)
		at = append(at, i)
	}
	rs, err := l.propose(ctx, admitted)
	if err != nil {
		return nil, err
	}
	for j, r := range rs {
		out[at[j]] = r
	}
	return out, nil
}

// admit asks Config.Admit about an acquire.
func (l *Lessor) admit(c fsm.Command) (done func(), err error) {
	if l.cfg.Admit == nil {
		return func() {}, nil
	}
	return l.cfg.Admit(c)
}

// proposeOne proposes one command, with the parked acquires.
func (l *Lessor) proposeOne(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	rs, err := l.propose(ctx, []fsm.Command{c})
	if err != nil {
		return fsm.Result{}, err
	}
	return rs[0], nil
}

// propose applies a batch's commands after the parked acquires it takes
// along, as one log entry if the format allows, and returns the results
// of cs.
func (l *Lessor) propose(ctx context.Context, cs []fsm.Command) ([]fsm.Result, error) {
	format := 0
	l.node.Read(func(st *fsm.State) { format = st.Format() })
	var taken []*join
	if format >= fsm.WaitBatchFormat {
		taken = l.joins.take(fsm.MaxBatch - len(cs))
	}
	if len(taken) == 0 {
		return l.apply(ctx, cs, format)
	}
	all := make([]fsm.Command, 0, len(taken)+len(cs))
	for _, j := range taken {
		all = append(all, j.c)
	}
	rs, err := l.apply(ctx, append(all, cs...), format)
	l.joins.answer(taken, rs, err)
	if err != nil {
		return nil, err
	}
	return rs[len(taken):], nil
}

// apply applies cs, as one log entry if the format allows.
func (l *Lessor) apply(ctx context.Context, cs []fsm.Command, format int) ([]fsm.Result, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	if len(cs) > 1 && format >= fsm.BatchFormat {
		r, err := l.submit(ctx, fsm.Command{Op: fsm.OpBatch, Commands: cs})
		if err != nil {
			return nil, err
		}
		if len(r.Results) != len(cs) {
			// The whole batch refused: a caller's bug, never a replica's.
			return nil, fmt.Errorf("batch of %d: %v: %w", len(cs), r.Outcome, r.Err)
		}
		return r.Results, nil
	}
	out := make([]fsm.Result, len(cs))
	for i, c := range cs {
		r, err := l.submit(ctx, c)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// submit is the one place the lessor hands a command to the node, and so
// to the log: the acquires, releases and batches that propose sends (with
// the parked acquires they carry), the promote of taking office, the
// expiries and a waiter's withdrawal. It returns once the command is
// applied, with its result, or with an error when its outcome is unknown.
func (l *Lessor) submit(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	return l.node.Apply(ctx, c)
}
