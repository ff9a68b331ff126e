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
	// whose callers were attached to the previous leader. From log format
	// 7 on it also raises every scope's counter to at least Token, the
	// token floor the leader chose (see FloorFormat).
	OpPromote Op = "promote"
	// OpSetNode records the API address of node Node as Addr.
	OpSetNode Op = "set_node"
	// OpForgetNode records that node Node was removed: its address is
	// dropped and its ID is refused from then on.
	OpForgetNode Op = "forget_node"
	// OpAddKey adds token-signing key KeyID with Seed. It signs from
	// ActivateAt (from log format 4 on; at once if 0), and older keys keep
	// verifying for TTL from then.
	OpAddKey Op = "add_key"
	// OpSetFormat raises the cluster's log format to Format (see
	// LogFormat). A node that does not know that format stops applying
	// when it meets this entry, so it must be proposed only once every
	// node runs a build that knows it.
	OpSetFormat Op = "set_format"
	// OpBatch applies each of Commands in order, as that many log entries
	// would, each with its own Result: one log entry for the acquires and
	// releases of many callers. It exists from log format 3 on, and may
	// carry waiting acquires from format 5 on; a proposer must fall back
	// to one entry per command below it.
	OpBatch Op = "batch"
)

// LogFormat is the highest log format this build applies. The log format
// says which commands exist and how they apply; the cluster's format, in
// the state, is raised by OpSetFormat, so every replica switches at the
// same entry.
//
//   - 1: the first format.
//   - 2: OpSetFormat; the records of idle scopes are dropped beyond a
//     few thousand, and a scope created again starts above every token of
//     the dropped ones.
//   - 3: OpBatch.
//   - 4: OpAddKey's ActivateAt: a new key is published before it signs.
//   - 5: an OpBatch may carry waiting acquires.
//   - 6: entries may be protobuf (BinaryFormat).
//   - 7: OpPromote raises every scope's counter to its Token (FloorFormat).
//   - 8: the end of a lease (release, expiry) consumes the next token
//     value, granted to nobody (CloseFormat).
//
// A build must apply every format up to its own exactly as the builds
// that introduced them did: replicas of different builds apply the same
// log alike until the format is raised.
const LogFormat = 8

// ErrUnknownEntry wraps DecodeCommand's error for an entry this build does
// not understand: an operation or field it does not know, a log format
// above LogFormat, or bytes that are not a command at all. A newer build,
// or corruption, wrote it; a replica that applied it in its own way, or
// not at all, would leave the others, so the caller must stop applying.
var ErrUnknownEntry = errors.New("log entry this build does not understand")

// MaxOwnerLen bounds the identity recorded with a lease.
const MaxOwnerLen = 256

// MaxRequestIDLen bounds the client request ID of an acquire.
const MaxRequestIDLen = 64

// MaxExpireMany bounds the expiries of one OpExpireMany.
const MaxExpireMany = 1024

// MaxBatch bounds the commands of one OpBatch.
const MaxBatch = 1000

// BatchFormat is the first log format with OpBatch.
const BatchFormat = 3

// WaitBatchFormat is the first log format whose OpBatch may carry
// waiting acquires. Builds before it refuse such a batch whole, so the
// leader proposes none below it.
const WaitBatchFormat = 5

// KeyScheduleFormat is the first log format whose OpAddKey may carry
// ActivateAt. A build before it refuses the field (it decodes with unknown
// fields disallowed) and stops, rather than sign with the new key at once
// as it would if it ignored the field; so the leader writes it only once
// the format is raised.
const KeyScheduleFormat = 4

// FloorFormat is the first log format whose OpPromote raises every
// scope's counter, and the floor of dropped scopes, to at least the
// promote's Token. The leader puts its wall clock there, in microseconds:
// a node that lost the end of its log (a corrupt or truncated file, a
// restored backup, a wiped data directory) takes office after every
// token it could have issued, so its next tokens are above them all
// (docs/design.md, "The token floor"). Below it the Token is ignored, as
// the builds before it did.
const FloorFormat = 7

// CloseFormat is the first log format in which the end of a lease, by
// release (OpRelease, or OpCancel of a granted waiter) or expiry (OpExpire,
// OpExpireMany), closes its token: it consumes the scope's next token
// value, N+1 for a lease of token N, and grants it to nobody. The event
// of the end carries it (Event.Closing), so that a follower advancing a
// guard's mark to it refuses N's late writes under the guard's unchanged
// rule before anyone else wrote; the next grant is N+2. A lease of token
// fence.MaxToken closes nothing, no value being left. Below it the end
// consumes nothing, as the builds before it did.
const CloseFormat = 8

// MaxKeyDelay bounds how long after At an OpAddKey's key may start to sign.
const MaxKeyDelay = 366 * 24 * time.Hour

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
	// ActivateAt is when an OpAddKey's key starts to sign, Unix
	// nanoseconds by the proposer's clock; 0 signs at once. Until then the
	// key is published, so guards fetch it before any token carries it.
	// Each replica compares it with its own clock when it signs: the time
	// is in the log, so a new leader keeps the schedule.
	ActivateAt int64 `json:"activate_at,omitempty"`
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
	// Format is the log format an OpSetFormat raises the cluster to.
	Format int `json:"format,omitempty"`
	// Commands are an OpBatch's acquires (without Wait) and releases.
	Commands []Command `json:"commands,omitempty"`
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
		if c.Token >= fence.MaxToken {
			return &fence.InvalidError{Field: "token", Reason: fmt.Sprintf("a token floor of %d leaves no token to grant; want below %d", c.Token, uint64(fence.MaxToken))}
		}
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
	case OpBatch:
		return validateBatch(c.Commands)
	case OpSetFormat:
		if c.Format < 1 || c.Format > LogFormat {
			return &fence.InvalidError{Field: "format", Reason: fmt.Sprintf("log format %d; this build knows 1 to %d", c.Format, LogFormat)}
		}
		return nil
	}
	return &fence.InvalidError{Field: "op", Reason: fmt.Sprintf("unknown operation %q", c.Op)}
}

// validateBatch checks only what the batch as a whole needs: each command
// is validated when it applies, so a malformed one is refused on its own.
// Whether a waiting acquire may be in it depends on the log format, which
// State.batch checks.
func validateBatch(cs []Command) error {
	if len(cs) == 0 || len(cs) > MaxBatch {
		return &fence.InvalidError{Field: "commands", Reason: fmt.Sprintf("%d in one batch, want 1 to %d", len(cs), MaxBatch)}
	}
	for i, b := range cs {
		switch {
		case b.Op != OpAcquire && b.Op != OpRelease:
			return &fence.InvalidError{Field: fmt.Sprintf("commands[%d].op", i), Reason: fmt.Sprintf("%q in a batch; only acquire and release", b.Op)}
		case len(b.Commands) > 0:
			return &fence.InvalidError{Field: fmt.Sprintf("commands[%d].commands", i), Reason: "a batch inside a batch"}
		}
	}
	return nil
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

// Encode returns the command's log form in JSON, as every format writes
// it before BinaryFormat (EncodeFor).
func (c Command) Encode() []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // unreachable: every field marshals
	}
	return b
}

// known reports whether this build knows the operation.
func (o Op) known() bool {
	_, ok := opNumbers[o]
	return ok
}

// DecodeCommand parses and validates a command's log form. An entry it
// does not understand gives an error wrapping ErrUnknownEntry; a command
// it understands but that is malformed gives another error, which every
// build that knows the command gives alike.
func DecodeCommand(b []byte) (Command, error) {
	var c Command
	if len(b) > 0 && b[0] == binaryMark {
		var err error
		if c, err = decodeBinary(b[1:]); err != nil {
			return Command{}, err
		}
	} else {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return Command{}, fmt.Errorf("decode command: %w: %w", ErrUnknownEntry, err)
		}
		if len(bytes.TrimSpace(b[dec.InputOffset():])) > 0 {
			return Command{}, fmt.Errorf("decode command: %w: trailing data after the command", ErrUnknownEntry)
		}
	}
	if !c.Op.known() {
		return Command{}, fmt.Errorf("decode command: %w: operation %q", ErrUnknownEntry, c.Op)
	}
	if c.Op == OpSetFormat && c.Format > LogFormat {
		return Command{}, fmt.Errorf("decode command: %w: the cluster's log format is raised to %d, this build knows 1 to %d", ErrUnknownEntry, c.Format, LogFormat)
	}
	if err := c.Validate(); err != nil {
		return Command{}, fmt.Errorf("decode command: %w", err)
	}
	return c, nil
}
