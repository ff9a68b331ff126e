package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/fence-dev/fence"
)

// Write is what a writer presents: its token and, optionally, a sequence
// number that orders its writes inside one epoch (0 means none).
type Write struct {
	Token fence.Token
	Seq   uint64
}

// Mark is the highest write a scope has accepted.
type Mark struct {
	Token uint64
	Seq   uint64
}

// StaleError reports a write refused because its scope already accepted a
// newer one. It unwraps to fence.ErrStale; the writer's lease is lost and
// retrying with the same token can never succeed.
type StaleError struct {
	Scope        string
	Presented    uint64 // the refused token
	Highest      uint64 // the highest token accepted
	PresentedSeq uint64 // sequence numbers, when the write carried one
	HighestSeq   uint64
}

func (e *StaleError) Error() string {
	if e.Presented == e.Highest {
		return fmt.Sprintf("stale write to %q: token %d sequence %d is not after sequence %d", e.Scope, e.Presented, e.PresentedSeq, e.HighestSeq)
	}
	return fmt.Sprintf("stale fencing token for %q: token %d was superseded by token %d", e.Scope, e.Presented, e.Highest)
}

func (e *StaleError) Unwrap() error { return fence.ErrStale }

// Check applies the rule to a scope's highest mark: it returns a
// *StaleError if w is older than highest, and nil if w may be applied
// (after which w's mark becomes the highest). With strict, a write with a
// sequence number must also be strictly after the highest sequence of its
// epoch: the same or a lower sequence under the same token is stale.
func Check(scope string, highest Mark, w Write, strict bool) error {
	t := w.Token.Value
	stale := t < highest.Token
	if t == highest.Token && w.Seq != 0 {
		stale = w.Seq < highest.Seq || strict && w.Seq == highest.Seq
	}
	if stale {
		return &StaleError{Scope: scope, Presented: t, Highest: highest.Token, PresentedSeq: w.Seq, HighestSeq: highest.Seq}
	}
	return nil
}

// Next returns the mark after accepting w over highest.
func Next(highest Mark, w Write) Mark {
	if w.Token.Value > highest.Token {
		return Mark{Token: w.Token.Value, Seq: w.Seq}
	}
	return Mark{Token: highest.Token, Seq: max(highest.Seq, w.Seq)}
}

// Store is the durable record of each scope's highest accepted mark.
// Implementations must be safe for concurrent use.
type Store interface {
	// Fence checks w against its scope's highest mark with Check. If w is
	// stale it returns the *StaleError and does not call apply. Otherwise
	// it calls apply and, if apply succeeds, records Next(highest, w).
	// Check, apply and record are one atomic step: Fence calls for one
	// scope never interleave, and if apply fails the record is unchanged.
	Fence(ctx context.Context, w Write, strict bool, apply func(ctx context.Context) error) error
}

// A Repeater is a Store whose Fence may call apply more than once for one
// write; only the effects of the last call are kept, and Fence answers for
// the last try: one that follows a failed call of apply checks w again and
// may find it stale, and Fence then returns the *StaleError, not apply's
// earlier error. boltguard's batched store is one: it commits concurrent
// writes in one transaction, and runs them again when one of them fails.
// Adapters that run a caller's handler
// inside apply ask Guard.Repeats, refuse such a store unless the caller
// opted in (httpguard.WithRepeats, grpcguard.WithRepeats), and prepare
// for it (httpguard reads a request body there).
type Repeater interface {
	Store
	RepeatsApply() bool
}

// A Lister is a Store that can name the scopes it holds a mark for. A
// follower (guard/follow) that starts afresh reads the service's state of
// each, so that a lease that ended while no follower ran is closed too.
// boltguard, sqlguard, pgxguard, redisguard and s3guard's stores are
// Listers.
type Lister interface {
	Store
	// Scopes returns the scopes starting with prefix that have a mark.
	Scopes(ctx context.Context, prefix string) ([]string, error)
}

// Guard checks writes against a Store for the scopes it protects. It is
// safe for concurrent use.
type Guard struct {
	store  Store
	strict bool
	log    *slog.Logger
	obs    Observer
	verify Verifier
}

// Verifier checks a token's signature; *signing.KeySet is one. A token it
// refuses never reaches the store, so a forged or inflated token cannot
// move the high-water mark.
type Verifier interface {
	Verify(fence.Token) error
}

// WithVerifier makes the guard accept only tokens v verifies: signed by
// the lease service, for this scope and this value. Without it any
// well-formed token is believed, and one forged token of 2^63−1 would lock
// every honest writer out.
func WithVerifier(v Verifier) Option { return optionFunc(func(g *Guard) { g.verify = v }) }

// Observer learns the outcome of every write a Guard checks, for metrics
// (guardmetrics has a Prometheus one). Its methods must be fast and safe
// for concurrent use.
type Observer interface {
	Accepted(scope string)
	Rejected(stale *StaleError)
}

// WithObserver reports every accepted and rejected write to o.
func WithObserver(o Observer) Option { return optionFunc(func(g *Guard) { g.obs = o }) }

// Option configures a Guard.
type Option interface{ apply(*Guard) }

type optionFunc func(*Guard)

func (f optionFunc) apply(g *Guard) { f(g) }

// WithStrictSequence refuses, inside one epoch, a write whose sequence
// number is not greater than the last accepted one: the "two concurrent
// mutations with token 12" case. Writes without a sequence number are
// ordered by token alone.
func WithStrictSequence() Option { return optionFunc(func(g *Guard) { g.strict = true }) }

// WithLogger logs every stale rejection to l (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(g *Guard) { g.log = l }) }

// New returns a Guard over store.
func New(store Store, opts ...Option) *Guard {
	g := &Guard{store: store, log: slog.Default()}
	for _, o := range opts {
		o.apply(g)
	}
	return g
}

// Repeats reports whether the guard's store may call apply more than once
// for one write (see Repeater).
func (g *Guard) Repeats() bool {
	r, ok := g.store.(Repeater)
	return ok && r.RepeatsApply()
}

// ErrWrongScope reports a token of one scope presented to a resource of
// another. It wraps fence.ErrInvalid.
var ErrWrongScope = fmt.Errorf("%w: token is for another scope", fence.ErrInvalid)

// Fence runs apply if w is a current write for scope: its token must be of
// that scope (else ErrWrongScope) and not stale (else *StaleError). apply
// runs inside the store's atomic section for the scope.
func (g *Guard) Fence(ctx context.Context, scope string, w Write, apply func(ctx context.Context) error) error {
	if err := g.admit(ctx, scope, w.Token); err != nil {
		return err
	}
	err := g.store.Fence(ctx, w, g.strict, apply)
	if err == nil && g.obs != nil {
		g.obs.Accepted(scope)
	}
	var stale *StaleError
	if errors.As(err, &stale) {
		if g.obs != nil {
			g.obs.Rejected(stale)
		}
		g.log.LogAttrs(ctx, slog.LevelWarn, "stale write rejected",
			slog.String("scope", stale.Scope),
			slog.Uint64("presented_token", stale.Presented),
			slog.Uint64("highest_token", stale.Highest),
			slog.Uint64("presented_seq", stale.PresentedSeq),
		)
	}
	return err
}

// Advance records tok as its scope's highest token, if it is higher,
// without applying a write: for a write whose token passed Fence's check
// but whose apply failed, so that its writes rolled back. The token was
// granted, so every older lease of the scope is over; recording it refuses
// their late writes at once instead of after the next successful write.
// The sequence number is not recorded: the failed write did not happen,
// and its retry may present the same one. A tok older than the scope's
// highest is no error, the mark being past it already. Advance checks tok
// as Fence does (scope, value, WithVerifier); it is counted and logged as
// no write. It is safe for concurrent use.
func (g *Guard) Advance(ctx context.Context, scope string, tok fence.Token) error {
	if err := g.admit(ctx, scope, tok); err != nil {
		return err
	}
	err := g.store.Fence(ctx, Write{Token: tok}, false, func(context.Context) error { return nil })
	var stale *StaleError
	if errors.As(err, &stale) {
		return nil
	}
	return err
}

// admit refuses a token of another scope, of a value no service issues,
// or that the guard's Verifier refuses.
func (g *Guard) admit(ctx context.Context, scope string, tok fence.Token) error {
	if tok.Scope != scope {
		return fmt.Errorf("%w: %s presented for scope %q", ErrWrongScope, tok, scope)
	}
	if tok.Value == 0 || tok.Value > fence.MaxToken {
		return &fence.InvalidError{Field: "token", Reason: fmt.Sprintf("value %d is outside 1 to %d", tok.Value, uint64(fence.MaxToken))}
	}
	if g.verify != nil {
		if err := g.verify.Verify(tok); err != nil {
			g.log.LogAttrs(ctx, slog.LevelWarn, "unverified token refused",
				slog.String("scope", scope), slog.Uint64("presented_token", tok.Value), slog.String("err", err.Error()))
			return err
		}
	}
	return nil
}
