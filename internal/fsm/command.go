package fsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/fence-dev/fence"
)

// Op names what a Command does.
type Op string

// The operations. Their names are stored in the replicated log, so they
// never change.
const (
	// OpAcquire grants the scope if free, else queues (Wait) or answers held.
	OpAcquire Op = "acquire"
	// OpRelease frees the scope if LeaseID is its current lease.
	OpRelease Op = "release"
	// OpExpire frees the scope if Token is still its current token.
	OpExpire Op = "expire"
	// OpExpireMany applies an Expire for each of Expiries, in order: one
	// log entry for many leases whose deadlines passed together.
	OpExpireMany Op = "expire_many"
	// OpCancel withdraws a waiter whose caller gave up; if the waiter was
	// granted meanwhile, it releases that grant.
	OpCancel Op = "cancel"
	// OpPromote marks a new leader taking office: it drops every waiter,
	// whose callers were attached to the previous leader.
	OpPromote Op = "promote"
	// OpSetNode records the API address of node Node as Addr.
	OpSetNode Op = "set_node"
	// OpForgetNode records that node Node was removed: its address is
	// dropped and its ID is refused from then on.
	OpForgetNode Op = "forget_node"
	// OpAddKey adds token-signing key KeyID with Seed, making it the one that
	// signs; older keys keep verifying for TTL from At.
	OpAddKey Op = "add_key"
)

// MaxOwnerLen bounds the identity recorded with a lease.
const MaxOwnerLen = 256

// MaxRequestIDLen bounds the client request ID of an acquire.
const MaxRequestIDLen = 64

// MaxExpireMany bounds the expiries of one OpExpireMany.
const MaxExpireMany = 1024

// Expiry names a lease to expire: the scope and its token.
type Expiry struct {
	Scope string `json:"scope"`
	Token uint64 `json:"token"`
}

// Command is one change to the State. The proposer fills in LeaseID and At
// before the command enters the log, so applying it is deterministic.
type Command struct {
	Op        Op            `json:"op"`
	Scope     string        `json:"scope,omitempty"`
	LeaseID   fence.LeaseID `json:"lease_id,omitzero"`
	Holder    string        `json:"holder,omitempty"`
	TTL       time.Duration `json:"ttl,omitempty"`
	Wait      bool          `json:"wait,omitempty"`
	RequestID string        `json:"request_id,omitempty"`
	Token     uint64        `json:"token,omitempty"`
	At        int64         `json:"at,omitempty"` // proposer's wall clock, Unix nanoseconds; recorded, never compared
	Node      string        `json:"node,omitempty"`
	Addr      string        `json:"addr,omitempty"`
	KeyID     string        `json:"key_id,omitempty"`
	// MaxWaiters bounds the line an acquire with Wait may join; 0 is no
	// bound. The leader stamps its configured limit into each acquire, so
	// every replica refuses the same ones.
	MaxWaiters int    `json:"max_waiters,omitempty"`
	Seed       string `json:"seed,omitempty"` // hexadecimal: the log is JSON text
	// Owner is the authenticated identity an acquire was made for (empty
	// without auth), kept with the lease so limits per identity survive a
	// change of leader.
	Owner    string   `json:"owner,omitempty"`
	Expiries []Expiry `json:"expiries,omitempty"`
}

// Validate reports whether c is well formed for its Op.
func (c Command) Validate() error {
	switch c.Op {
	case OpAcquire:
		if err := fence.ValidateScope(c.Scope); err != nil {
			return err
		}
		if err := fence.ValidateHolder(c.Holder); err != nil {
			return err
		}
		if c.TTL <= 0 {
			return &fence.InvalidError{Field: "ttl", Reason: fmt.Sprintf("%v is not positive", c.TTL)}
		}
		if len(c.Owner) > MaxOwnerLen || !utf8.ValidString(c.Owner) {
			return &fence.InvalidError{Field: "owner", Reason: fmt.Sprintf("want at most %d bytes of UTF-8", MaxOwnerLen)}
		}
		if c.MaxWaiters < 0 {
			return &fence.InvalidError{Field: "max_waiters", Reason: fmt.Sprintf("%d is negative", c.MaxWaiters)}
		}
		if len(c.RequestID) > MaxRequestIDLen {
			return &fence.InvalidError{Field: "request_id", Reason: fmt.Sprintf("%d bytes long, at most %d allowed", len(c.RequestID), MaxRequestIDLen)}
		}
		if !utf8.ValidString(c.RequestID) {
			// JSON would replace the bad bytes, so replicas would apply another ID.
			return &fence.InvalidError{Field: "request_id", Reason: "not valid UTF-8"}
		}
		return needID(c)
	case OpRelease, OpCancel:
		if err := fence.ValidateScope(c.Scope); err != nil {
			return err
		}
		return needID(c)
	case OpExpire:
		return validateExpiry(Expiry{Scope: c.Scope, Token: c.Token})
	case OpExpireMany:
		if len(c.Expiries) == 0 || len(c.Expiries) > MaxExpireMany {
			return &fence.InvalidError{Field: "expiries", Reason: fmt.Sprintf("%d in one command, want 1 to %d", len(c.Expiries), MaxExpireMany)}
		}
		for i, e := range c.Expiries {
			if err := validateExpiry(e); err != nil {
				var inv *fence.InvalidError
				if errors.As(err, &inv) {
					return &fence.InvalidError{Field: fmt.Sprintf("expiries[%d].%s", i, inv.Field), Reason: inv.Reason}
				}
				return err
			}
		}
		return nil
	case OpPromote:
		return nil
	case OpSetNode:
		if err := ValidateNodeID(c.Node); err != nil {
			return err
		}
		return validateAddr(c.Addr)
	case OpForgetNode:
		return ValidateNodeID(c.Node)
	case OpAddKey:
		return validateKeyCommand(c)
	}
	return &fence.InvalidError{Field: "op", Reason: fmt.Sprintf("unknown operation %q", c.Op)}
}

func validateExpiry(e Expiry) error {
	if err := fence.ValidateScope(e.Scope); err != nil {
		return err
	}
	if e.Token == 0 {
		return &fence.InvalidError{Field: "token", Reason: "expire needs the token to expire"}
	}
	return nil
}

func needID(c Command) error {
	if c.LeaseID.IsZero() {
		return &fence.InvalidError{Field: "lease_id", Reason: fmt.Sprintf("%s needs a lease ID", c.Op)}
	}
	return nil
}

// Encode returns the command's log form.
func (c Command) Encode() []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // unreachable: every field marshals
	}
	return b
}

// DecodeCommand parses and validates a command's log form.
func DecodeCommand(b []byte) (Command, error) {
	var c Command
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Command{}, fmt.Errorf("decode command: %w", err)
	}
	if len(bytes.TrimSpace(b[dec.InputOffset():])) > 0 {
		return Command{}, fmt.Errorf("decode command: trailing data after the command")
	}
	if err := c.Validate(); err != nil {
		return Command{}, fmt.Errorf("decode command: %w", err)
	}
	return c, nil
}
