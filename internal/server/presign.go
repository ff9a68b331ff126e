package server

import (
	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// maxQueuedPresigns bounds the grants waiting for their scope's next
// signature; past it a grant is not signed ahead, and nothing waits.
const maxQueuedPresigns = 1024

// presigner makes, ahead of time, the signature of the next grant's token
// of a scope that was just granted (two values on from log format 8,
// where the end of each lease takes one), when that scope is one this node
// granted before: a lock taken again and again, or a contended scope whose line
// takes its turns. The grant that follows then finds its signature in the
// signer's cache instead of making it while its caller waits; a token's
// signature covers only its scope and value, and Ed25519 signatures are
// deterministic, so a signature made ahead is the one it would have made.
// A scope granted once is not signed ahead, so a workload of new scopes
// costs no signature more. It works on one goroutine, from a bounded
// queue that grants are dropped from when it is behind.
type presigner struct {
	s    *Server
	ch   chan fence.Token
	done chan struct{}
}

func newPresigner(s *Server) *presigner {
	p := &presigner{s: s, ch: make(chan fence.Token, maxQueuedPresigns), done: make(chan struct{})}
	go p.run()
	return p
}

// granted queues the grant of token t. It never waits.
func (p *presigner) granted(t fence.Token) {
	select {
	case p.ch <- t:
	default:
	}
}

func (p *presigner) run() {
	defer close(p.done)
	for t := range p.ch {
		// From fsm.CloseFormat on, the end of each lease takes a token
		// value of its own: the scope's grants go 2 apart.
		step := uint64(1)
		if p.s.node.Format() >= fsm.CloseFormat {
			step = 2
		}
		if t.Value <= step || t.Value > fence.MaxToken-step {
			continue
		}
		if p.s.signer.signed(fence.Token{Scope: t.Scope, Value: t.Value - step}) {
			p.s.sign(fence.Token{Scope: t.Scope, Value: t.Value + step}) // a no-op if already made
		}
	}
}

// Close stops the goroutine. No grant may be queued after it.
func (p *presigner) Close() {
	close(p.ch)
	<-p.done
}
