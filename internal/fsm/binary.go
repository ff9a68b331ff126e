package fsm

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fence-dev/fence"
	logv1 "github.com/fence-dev/fence/api/fence/log/v1"
)

// BinaryFormat is the first log format whose entries may be protobuf
// (api/fence/log/v1) rather than JSON. Decoding JSON took a third of the
// state machine goroutine's time on a busy leader (eda15be:BENCHMARKS.md), and
// that goroutine is in the path of every grant. Builds before it stop at a
// binary entry, so a proposer writes one only once the format is raised.
const BinaryFormat = 6

// binaryMark starts a binary entry: no JSON text starts with it, so an
// entry says which form it is in.
const binaryMark = 0x06

// opNumbers are every operation this build knows (Op.known), with its
// number in binary entries.
var opNumbers = map[Op]logv1.Op{
	OpAcquire:    logv1.Op_OP_ACQUIRE,
	OpRelease:    logv1.Op_OP_RELEASE,
	OpExpire:     logv1.Op_OP_EXPIRE,
	OpExpireMany: logv1.Op_OP_EXPIRE_MANY,
	OpCancel:     logv1.Op_OP_CANCEL,
	OpPromote:    logv1.Op_OP_PROMOTE,
	OpSetNode:    logv1.Op_OP_SET_NODE,
	OpForgetNode: logv1.Op_OP_FORGET_NODE,
	OpAddKey:     logv1.Op_OP_ADD_KEY,
	OpSetFormat:  logv1.Op_OP_SET_FORMAT,
	OpBatch:      logv1.Op_OP_BATCH,
}

var opNames = func() map[logv1.Op]Op {
	m := make(map[logv1.Op]Op, len(opNumbers))
	for name, n := range opNumbers {
		m[n] = name
	}
	return m
}()

// EncodeFor returns the command's log form under the cluster's log format:
// binary from BinaryFormat on, else JSON (Encode). A command protobuf
// cannot carry (a string that is not UTF-8, which JSON would change to
// U+FFFD, or an operation this build does not know) is written as JSON at
// any format: either form decodes alike on every build that knows it.
func (c Command) EncodeFor(format int) []byte {
	if format < BinaryFormat {
		return c.Encode()
	}
	var m logv1.Command
	if !fill(&m, &c) {
		return c.Encode()
	}
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend([]byte{binaryMark}, &m)
	if err != nil {
		return c.Encode()
	}
	return b
}

// fill sets m to c, and reports false if c has an operation protobuf
// cannot carry. A batch's commands share one allocation: a leader encodes
// a batch for every round of its callers.
func fill(m *logv1.Command, c *Command) bool {
	op, ok := opNumbers[c.Op]
	if !ok {
		return false
	}
	m.Op, m.Scope, m.Holder, m.Ttl, m.Wait = op, c.Scope, c.Holder, int64(c.TTL), c.Wait
	m.RequestId, m.Token, m.At, m.Node, m.Addr = c.RequestID, c.Token, c.At, c.Node, c.Addr
	m.KeyId, m.ActivateAt, m.MaxWaiters = c.KeyID, c.ActivateAt, int64(c.MaxWaiters)
	m.Seed, m.Owner, m.Format = c.Seed, c.Owner, int64(c.Format)
	if !c.LeaseID.IsZero() {
		m.LeaseId = c.LeaseID[:]
	}
	if len(c.Expiries) > 0 {
		es := make([]logv1.Expiry, len(c.Expiries))
		m.Expiries = make([]*logv1.Expiry, len(c.Expiries))
		for i, e := range c.Expiries {
			es[i].Scope, es[i].Token = e.Scope, e.Token
			m.Expiries[i] = &es[i]
		}
	}
	if len(c.Commands) > 0 {
		subs := make([]logv1.Command, len(c.Commands))
		m.Commands = make([]*logv1.Command, len(c.Commands))
		for i := range c.Commands {
			if !fill(&subs[i], &c.Commands[i]) {
				return false
			}
			m.Commands[i] = &subs[i]
		}
	}
	return true
}

// decodeBinary parses a binary entry (without its mark) into the Command
// it was encoded from. Anything EncodeFor does not write (an unknown
// field or operation, a lease ID that is not 16 bytes) is an entry this
// build does not understand.
func decodeBinary(b []byte) (Command, error) {
	var m logv1.Command
	if err := proto.Unmarshal(b, &m); err != nil {
		return Command{}, fmt.Errorf("decode command: %w: %w", ErrUnknownEntry, err)
	}
	c, err := fromProto(&m)
	if err != nil {
		return Command{}, fmt.Errorf("decode command: %w: %w", ErrUnknownEntry, err)
	}
	return c, nil
}

func fromProto(m *logv1.Command) (Command, error) {
	if len(m.ProtoReflect().GetUnknown()) > 0 {
		return Command{}, fmt.Errorf("a field this build does not know")
	}
	op, ok := opNames[m.Op]
	if !ok {
		return Command{}, fmt.Errorf("operation number %d", m.Op)
	}
	c := Command{
		Op: op, Scope: m.Scope, Holder: m.Holder, TTL: time.Duration(m.Ttl), Wait: m.Wait,
		RequestID: m.RequestId, Token: m.Token, At: m.At, Node: m.Node, Addr: m.Addr,
		KeyID: m.KeyId, ActivateAt: m.ActivateAt, MaxWaiters: int(m.MaxWaiters),
		Seed: m.Seed, Owner: m.Owner, Format: int(m.Format),
	}
	switch len(m.LeaseId) {
	case 0:
	case len(fence.LeaseID{}):
		c.LeaseID = fence.LeaseID(m.LeaseId)
	default:
		return Command{}, fmt.Errorf("a lease ID of %d bytes", len(m.LeaseId))
	}
	if len(m.Expiries) > 0 {
		c.Expiries = make([]Expiry, len(m.Expiries))
		for i, e := range m.Expiries {
			if len(e.ProtoReflect().GetUnknown()) > 0 {
				return Command{}, fmt.Errorf("a field this build does not know in expiries[%d]", i)
			}
			c.Expiries[i] = Expiry{Scope: e.Scope, Token: e.Token}
		}
	}
	if len(m.Commands) > 0 {
		c.Commands = make([]Command, len(m.Commands))
		for i, sub := range m.Commands {
			var err error
			if c.Commands[i], err = fromProto(sub); err != nil {
				return Command{}, fmt.Errorf("commands[%d]: %w", i, err)
			}
		}
	}
	return c, nil
}
