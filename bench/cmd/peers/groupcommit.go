package main

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence/guard"
)

// groupCommit is a prototype, measured beside boltguard: the same fenced
// write (check the scope's highest token, advance it, put the data, in one
// transaction) with the writes that arrive while one commit runs committed
// together in the next, so that one pair of bbolt fsyncs serves many
// writes. boltguard.Store.Update commits each write on its own. Nothing
// waits for a batch to fill: a lone writer commits at once.
type groupCommit struct {
	db   *bbolt.DB
	reqs chan *pendingWrite
}

type pendingWrite struct {
	scope string
	w     guard.Write
	data  []byte
	done  chan error
}

var (
	marksBucket = []byte("bench_marks")
	dataBucket  = []byte("data")
)

func newGroupCommit(db *bbolt.DB) *groupCommit {
	g := &groupCommit{db: db, reqs: make(chan *pendingWrite, 1024)}
	go g.loop()
	return g
}

// write checks w against scope's highest token and, unless it is stale,
// stores data under scope; it returns once that is durable.
func (g *groupCommit) write(scope string, w guard.Write, data []byte) error {
	p := &pendingWrite{scope: scope, w: w, data: data, done: make(chan error, 1)}
	g.reqs <- p
	return <-p.done
}

func (g *groupCommit) loop() {
	for first := range g.reqs {
		batch := []*pendingWrite{first}
	drain:
		for len(batch) < 1000 {
			select {
			case p := <-g.reqs:
				batch = append(batch, p)
			default:
				break drain
			}
		}
		g.commit(batch)
	}
}

// commit runs the batch in one transaction. A stale write is refused on
// its own (it made no change); any other failure fails the whole batch.
func (g *groupCommit) commit(batch []*pendingWrite) {
	refused := make([]error, len(batch))
	err := g.db.Update(func(tx *bbolt.Tx) error {
		marks, data := tx.Bucket(marksBucket), tx.Bucket(dataBucket)
		if marks == nil || data == nil {
			return errors.New("buckets missing")
		}
		for i, p := range batch {
			var highest guard.Mark
			if b := marks.Get([]byte(p.scope)); len(b) == 8 {
				highest.Token = binary.BigEndian.Uint64(b)
			}
			if p.w.Token.Scope != p.scope {
				refused[i] = fmt.Errorf("token of scope %q for scope %q", p.w.Token.Scope, p.scope)
				continue
			}
			if err := guard.Check(p.scope, highest, p.w, false); err != nil {
				refused[i] = err
				continue
			}
			if err := marks.Put([]byte(p.scope), binary.BigEndian.AppendUint64(nil, p.w.Token.Value)); err != nil {
				return err
			}
			if err := data.Put([]byte(p.scope), p.data); err != nil {
				return err
			}
		}
		return nil
	})
	for i, p := range batch {
		p.done <- cmp.Or(err, refused[i])
	}
}
