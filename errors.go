package fence

import (
	"errors"
	"fmt"
	"time"
)

// These errors are returned by the client, the guards and the service. Test
// for them with [errors.Is]; the structured types below unwrap to them.
var (
	// ErrInvalid reports a malformed request: a bad scope, TTL, holder,
	// lease ID or token. Nothing was changed.
	ErrInvalid = errors.New("invalid argument")

	// ErrHeld reports that the scope is held by another lease. The error
	// is a *HeldError naming the holder, its token and its time left.
	ErrHeld = errors.New("scope is held")

	// ErrLeaseLost reports that a lease is no longer current: it expired,
	// was released, was superseded by a newer grant, or a guard rejected
	// its token as stale. Its holder must stop acting on it.
	ErrLeaseLost = errors.New("lease lost")

	// ErrNotHolder reports a renew or release with a lease ID that never
	// held the scope.
	ErrNotHolder = errors.New("not the lease holder")

	// ErrStale reports a write whose token is lower than the highest token
	// the guard has accepted for the scope.
	ErrStale = errors.New("stale fencing token")

	// ErrTokensExhausted reports that a scope's token counter reached its
	// maximum, 2^63-1. The service refuses to grant rather than wrap.
	ErrTokensExhausted = errors.New("fencing tokens exhausted")

	// ErrUnavailable reports that the service could not be reached or has
	// no leader right now. The request may or may not have been applied;
	// retrying an acquire with the same request ID is safe.
	ErrUnavailable = errors.New("lease service unavailable")

	// ErrMissedEvents reports that a watch cannot resume where it left
	// off: the leader no longer retains the events after that position (it
	// keeps a bounded number of recent events, and a new leader starts
	// afresh). Read the current state again and watch from now.
	ErrMissedEvents = errors.New("watch missed events")

	// ErrClosed reports a call that needs a client already closed, such
	// as an acquire after Close: the client no longer keeps leases alive.
	ErrClosed = errors.New("client is closed")
)

// These errors report a call the service refused before looking at its
// leases: who is calling, what they may do, and what the service knows.
// Nothing was changed.
var (
	// ErrUnauthenticated reports a call without valid credentials to a
	// service that needs them: no client certificate or bearer token, or
	// one the service does not know.
	ErrUnauthenticated = errors.New("unauthenticated")

	// ErrPermissionDenied reports a call whose caller the service knows
	// but whose rules do not allow it: an operation, or a scope outside
	// the caller's prefixes. Retrying does not help.
	ErrPermissionDenied = errors.New("permission denied")

	// ErrUnimplemented reports a call the service does not know, usually
	// because it is older than the client.
	ErrUnimplemented = errors.New("not implemented by the service")
)

// InvalidError describes a request field that was rejected. It unwraps to
// [ErrInvalid].
type InvalidError struct {
	Field  string // the offending field, such as "scope" or "ttl"
	Reason string // what was wrong and what is allowed
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason)
}

func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// HeldError reports that an acquire found the scope held. It unwraps to
// [ErrHeld].
type HeldError struct {
	Scope     string
	Holder    string
	Token     uint64
	ExpiresIn time.Duration // the holder's time left as the service saw it
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("scope %q is held by %q with token %d, %s left",
		e.Scope, e.Holder, e.Token, e.ExpiresIn.Round(time.Millisecond))
}

func (e *HeldError) Unwrap() error { return ErrHeld }

// LostError reports that a lease is no longer current. It unwraps to
// [ErrLeaseLost].
type LostError struct {
	Scope   string
	Token   uint64 // the lost lease's token, 0 if unknown
	Current uint64 // the scope's current token as last seen, 0 if free or unknown
	Reason  string // why, for people: "expired", "released", "stale rejection", …
}

func (e *LostError) Error() string {
	msg := fmt.Sprintf("lease on %q", e.Scope)
	if e.Token != 0 {
		msg += fmt.Sprintf(" with token %d", e.Token)
	}
	msg += " is lost"
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Current != 0 {
		msg += fmt.Sprintf(" (current token %d)", e.Current)
	}
	return msg
}

func (e *LostError) Unwrap() error { return ErrLeaseLost }
