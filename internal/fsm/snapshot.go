package fsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/fence-dev/fence"
)

// snapshotMagic starts every snapshot; the checksum of the body follows it
// on the first line.
const snapshotMagic = "fence-fsm-snapshot v1 crc32c="

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type snapshotBody struct {
	Scopes  []snapshotScope   `json:"scopes"`
	Nodes   map[string]string `json:"nodes,omitempty"`
	Removed []string          `json:"removed,omitempty"`
	Keys    []SigningKey      `json:"keys,omitempty"`
}

type snapshotScope struct {
	Scope   string   `json:"scope"`
	Last    uint64   `json:"last"`
	Lease   *Lease   `json:"lease,omitempty"`
	Waiters []Waiter `json:"waiters,omitempty"`
	Recent  []grant  `json:"recent,omitempty"`
}

// Snapshot encodes the whole state. Equal states encode to equal bytes.
func (s *State) Snapshot() []byte {
	head, body := s.Freeze().Encode()
	return append(head, body...)
}

// Frozen is the state's content at one moment, captured so that encoding
// it can happen elsewhere while the state moves on: Raft takes a snapshot
// on the goroutine that applies commands, and encoding a million leases
// there would hold every command back for seconds.
type Frozen struct{ body snapshotBody }

// Freeze captures the state for Encode. It copies what later commands
// change in place (lines of waiters and recent grants, shifted when one
// leaves) and shares what they only replace (each lease), so it costs one
// pass over the scopes.
func (s *State) Freeze() *Frozen {
	f := &Frozen{}
	f.body.Scopes = make([]snapshotScope, 0, len(s.scopes))
	for name, sc := range s.scopes {
		f.body.Scopes = append(f.body.Scopes, snapshotScope{
			Scope: name, Last: sc.last, Lease: sc.lease, Waiters: slices.Clone(sc.waiters), Recent: slices.Clone(sc.recent),
		})
	}
	if len(s.nodes) > 0 {
		f.body.Nodes = maps.Clone(s.nodes) // encoding/json sorts map keys
	}
	f.body.Removed = s.removedList()
	f.body.Keys = slices.Clone(s.keys)
	return f
}

// Encode returns the snapshot's first line (its format and the body's
// checksum) and its body, apart, so that a writer need not join them.
func (f *Frozen) Encode() (head, body []byte) {
	slices.SortFunc(f.body.Scopes, func(a, b snapshotScope) int { return strings.Compare(a.Scope, b.Scope) })
	body, err := json.Marshal(f.body)
	if err != nil {
		panic(err) // unreachable: every field marshals
	}
	return fmt.Appendf(nil, "%s%08x\n", snapshotMagic, crc32.Checksum(body, castagnoli)), body
}

// Restore decodes a snapshot into a new State. It checks the checksum and
// every record before returning, so a truncated or corrupted snapshot is
// refused whole: nothing is half applied.
func Restore(b []byte) (*State, error) {
	head, body, ok := bytes.Cut(b, []byte("\n"))
	if !ok || !strings.HasPrefix(string(head), snapshotMagic) {
		return nil, fmt.Errorf("restore snapshot: not a fence snapshot (bad header)")
	}
	want, err := strconv.ParseUint(strings.TrimPrefix(string(head), snapshotMagic), 16, 32)
	if err != nil {
		return nil, fmt.Errorf("restore snapshot: bad checksum field: %w", err)
	}
	if got := crc32.Checksum(body, castagnoli); got != uint32(want) {
		return nil, fmt.Errorf("restore snapshot: checksum mismatch (stored %08x, computed %08x): truncated or corrupted", want, got)
	}
	var sb snapshotBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sb); err != nil {
		return nil, fmt.Errorf("restore snapshot: %w", err)
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return nil, fmt.Errorf("restore snapshot: trailing data after the body")
	}
	s := New()
	for _, r := range sb.Scopes {
		if err := r.check(); err != nil {
			return nil, fmt.Errorf("restore snapshot: scope %q: %w", r.Scope, err)
		}
		if _, dup := s.scopes[r.Scope]; dup {
			return nil, fmt.Errorf("restore snapshot: scope %q appears twice", r.Scope)
		}
		s.scopes[r.Scope] = &scope{last: r.Last, lease: r.Lease, waiters: r.Waiters, recent: r.Recent}
		if r.Lease != nil {
			s.held.ReplaceOrInsert(r.Scope)
		}
	}
	for id, addr := range sb.Nodes {
		if err := ValidateNodeID(id); err != nil {
			return nil, fmt.Errorf("restore snapshot: %w", err)
		}
		if err := validateAddr(addr); err != nil {
			return nil, fmt.Errorf("restore snapshot: node %q: %w", id, err)
		}
		s.nodes[id] = addr
	}
	for _, id := range sb.Removed {
		if err := ValidateNodeID(id); err != nil {
			return nil, fmt.Errorf("restore snapshot: removed %w", err)
		}
		if _, ok := s.nodes[id]; ok {
			return nil, fmt.Errorf("restore snapshot: node %q is both a member and removed", id)
		}
		s.removed[id] = true
	}
	if err := checkKeys(sb.Keys); err != nil {
		return nil, fmt.Errorf("restore snapshot: signing %w", err)
	}
	s.keys = sb.Keys
	return s, nil
}

func (r snapshotScope) check() error {
	if err := fence.ValidateScope(r.Scope); err != nil {
		return err
	}
	if r.Last > fence.MaxToken {
		return fmt.Errorf("counter %d above the maximum token", r.Last)
	}
	if r.Lease != nil && (r.Lease.Token == 0 || r.Lease.Token > r.Last || r.Lease.ID.IsZero() || r.Lease.TTL <= 0) {
		return fmt.Errorf("lease %+v does not fit counter %d", *r.Lease, r.Last)
	}
	if r.Lease == nil && len(r.Waiters) > 0 {
		return fmt.Errorf("%d waiters on a free scope", len(r.Waiters))
	}
	for _, w := range r.Waiters {
		if w.ID.IsZero() || w.TTL <= 0 {
			return fmt.Errorf("malformed waiter %+v", w)
		}
	}
	if len(r.Recent) > recentGrants {
		return fmt.Errorf("%d recent grants, at most %d kept", len(r.Recent), recentGrants)
	}
	for _, g := range r.Recent {
		if g.ID.IsZero() {
			return fmt.Errorf("recent grant token %d has no lease ID", g.Token)
		}
		if g.Token == 0 || g.Token > r.Last {
			return fmt.Errorf("recent grant token %d does not fit counter %d", g.Token, r.Last)
		}
	}
	return nil
}
