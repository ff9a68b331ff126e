package fsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
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

// snapshotBody is the snapshot's body. The fields after Keys appear from
// log format 2 on: a state of format 1 encodes as the builds before them
// did, so that a node of such a build can restore it during an upgrade.
type snapshotBody struct {
	Scopes  []snapshotScope   `json:"scopes"`
	Nodes   map[string]string `json:"nodes,omitempty"`
	Removed []string          `json:"removed,omitempty"`
	Keys    []SigningKey      `json:"keys,omitempty"`
	Format  int               `json:"format,omitempty"`
	Floor   uint64            `json:"floor,omitempty"`
	Idle    []string          `json:"idle,omitempty"` // the idle scopes, oldest first
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
	var b bytes.Buffer
	if _, err := s.Freeze().WriteTo(&b); err != nil {
		panic(err) // unreachable: a bytes.Buffer takes every write
	}
	return b.Bytes()
}

// Frozen is the state's content at one moment, captured so that encoding
// it can happen elsewhere while the state moves on: Raft takes a snapshot
// on the goroutine that applies commands, and encoding a million leases
// there would hold every command back for seconds.
type Frozen struct {
	scopes  []frozenScope
	nodes   map[string]string
	removed []string
	keys    []SigningKey
	format  int // 0 for format 1, which the body does not name
	floor   uint64
	idle    []string
}

// frozenScope is a scope's record as Freeze found it. A copy of the record
// (its lease is replaced, never changed in place) is 40 bytes; the
// snapshot's form of it would be twice that, a million times over.
type frozenScope struct {
	name string
	sc   scope
}

func (fs *frozenScope) record() snapshotScope {
	return snapshotScope{Scope: fs.name, Last: fs.sc.last, Lease: fs.sc.lease, Waiters: fs.sc.waiters(), Recent: fs.sc.ended()}
}

// Freeze captures the state for WriteTo. It copies each scope's record,
// and its lines of waiters and ended grants, if it has any, which later
// commands shift in place; it shares each lease, which they only replace.
// So it costs one pass over the scopes, and allocates nothing for a scope
// whose lease is its first grant: WriteTo adds the current lease to the
// recent grants.
func (s *State) Freeze() *Frozen {
	f := &Frozen{scopes: make([]frozenScope, 0, len(s.scopes))}
	for name, sc := range s.scopes {
		fs := frozenScope{name: name, sc: *sc}
		if sc.more != nil {
			fs.sc.more = &scopeMore{waiters: slices.Clone(sc.more.waiters), ended: slices.Clone(sc.more.ended), idle: sc.more.idle}
		}
		f.scopes = append(f.scopes, fs)
	}
	if len(s.nodes) > 0 {
		f.nodes = maps.Clone(s.nodes) // encoding/json sorts map keys
	}
	f.removed = s.removedList()
	f.keys = slices.Clone(s.keys)
	if s.format >= 2 {
		f.format, f.floor = s.format, s.floor
		f.idle = make([]string, 0, s.idle.Len())
		s.idle.Ascend(func(i idleScope) bool {
			f.idle = append(f.idle, i.name)
			return true
		})
	}
	return f
}

// WriteTo writes the snapshot to w: its first line (the format and the
// body's checksum), then the body. It streams: a million leases make a
// body of hundreds of megabytes, which is never held in memory. Because
// the checksum comes first, the body is encoded twice, once for the
// checksum and once for w. It writes a scope at a time: give it a
// buffered writer.
func (f *Frozen) WriteTo(w io.Writer) (int64, error) {
	slices.SortFunc(f.scopes, func(a, b frozenScope) int { return strings.Compare(a.name, b.name) })
	crc := crc32.New(castagnoli)
	if err := f.writeBody(crc); err != nil {
		return 0, err
	}
	cw := &countingWriter{w: w}
	if _, err := fmt.Fprintf(cw, "%s%08x\n", snapshotMagic, crc.Sum32()); err != nil {
		return cw.n, err
	}
	err := f.writeBody(cw)
	return cw.n, err
}

// writeBody writes, one scope at a time, the bytes json.Marshal would
// return for the snapshotBody of f with each scope's recent grants
// completed.
func (f *Frozen) writeBody(w io.Writer) error {
	rest, err := json.Marshal(struct {
		Nodes   map[string]string `json:"nodes,omitempty"`
		Removed []string          `json:"removed,omitempty"`
		Keys    []SigningKey      `json:"keys,omitempty"`
		Format  int               `json:"format,omitempty"`
		Floor   uint64            `json:"floor,omitempty"`
		Idle    []string          `json:"idle,omitempty"`
	}{f.nodes, f.removed, f.keys, f.format, f.floor, f.idle})
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, `{"scopes":[`); err != nil {
		return err
	}
	// One Encoder and one buffer for every scope: json.Marshal would
	// allocate each scope's bytes, a million times twice per snapshot,
	// for the collector to clear. The buffer starts with the separator;
	// Encode's newline is dropped.
	var (
		buf    bytes.Buffer
		recent []grant
	)
	enc := json.NewEncoder(&buf)
	for i := range f.scopes {
		buf.Reset()
		if i > 0 {
			buf.WriteByte(',')
		}
		sc := f.scopes[i].record()
		recent = sc.complete(recent)
		if err := enc.Encode(&sc); err != nil {
			return err
		}
		if _, err := w.Write(buf.Bytes()[:buf.Len()-1]); err != nil {
			return err
		}
	}
	// rest is {} or {"nodes":...}: its members follow the scopes.
	tail := []byte("]}")
	if len(rest) > 2 {
		tail = append([]byte("],"), rest[1:]...)
	}
	_, err = w.Write(tail)
	return err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Restore decodes a snapshot into a new State. It checks the checksum and
// every record before returning, so a truncated or corrupted snapshot is
// refused whole: nothing is half applied.
func Restore(b []byte) (*State, error) { return RestoreFrom(bytes.NewReader(b)) }

// RestoreFrom is Restore reading from r, one scope at a time, so that
// restoring holds the state and a small buffer, not the whole snapshot.
func RestoreFrom(r io.Reader) (*State, error) {
	head, err := readLine(r, len(snapshotMagic)+16)
	if err != nil || !strings.HasPrefix(head, snapshotMagic) {
		return nil, fmt.Errorf("restore snapshot: not a fence snapshot (bad header)")
	}
	want, err := strconv.ParseUint(strings.TrimPrefix(head, snapshotMagic), 16, 32)
	if err != nil {
		return nil, fmt.Errorf("restore snapshot: bad checksum field: %w", err)
	}
	crc := crc32.New(castagnoli)
	body := io.TeeReader(r, crc)
	s, derr := decodeBody(body)
	// The checksum covers the whole body, read or not: a corrupted body
	// is reported as such, even where it first failed to decode.
	if _, err := io.Copy(io.Discard, body); err != nil {
		return nil, fmt.Errorf("restore snapshot: %w", err)
	}
	if got := crc.Sum32(); got != uint32(want) {
		return nil, fmt.Errorf("restore snapshot: checksum mismatch (stored %08x, computed %08x): truncated or corrupted", want, got)
	}
	if derr != nil {
		return nil, fmt.Errorf("restore snapshot: %w", derr)
	}
	return s, nil
}

// readLine reads up to a newline, a byte at a time so as to read nothing
// after it, and returns the line without it; at most limit bytes.
func readLine(r io.Reader, limit int) (string, error) {
	var line []byte
	b := make([]byte, 1)
	for len(line) <= limit {
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
	return "", fmt.Errorf("no newline in the first %d bytes", limit)
}

// decodeBody decodes and checks a snapshot's body, streaming its scopes.
func decodeBody(r io.Reader) (*State, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	delim := func(want json.Delim) error {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		if t != want {
			return fmt.Errorf("found %v where %v belongs", t, want)
		}
		return nil
	}
	if err := delim('{'); err != nil {
		return nil, err
	}
	s := New()
	var sb snapshotBody
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := t.(string)
		if seen[key] {
			return nil, fmt.Errorf("field %q appears twice", key)
		}
		seen[key] = true
		switch key {
		case "scopes":
			if err := delim('['); err != nil {
				return nil, err
			}
			for dec.More() {
				var r snapshotScope
				if err := dec.Decode(&r); err != nil {
					return nil, err
				}
				if err := s.restoreScope(r); err != nil {
					return nil, err
				}
			}
			if err := delim(']'); err != nil {
				return nil, err
			}
		case "nodes":
			err = dec.Decode(&sb.Nodes)
		case "removed":
			err = dec.Decode(&sb.Removed)
		case "keys":
			err = dec.Decode(&sb.Keys)
		case "format":
			err = dec.Decode(&sb.Format)
		case "floor":
			err = dec.Decode(&sb.Floor)
		case "idle":
			err = dec.Decode(&sb.Idle)
		default:
			err = fmt.Errorf("unknown field %v", t)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := delim('}'); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after the body")
	}
	for id, addr := range sb.Nodes {
		if err := ValidateNodeID(id); err != nil {
			return nil, err
		}
		if err := validateAddr(addr); err != nil {
			return nil, fmt.Errorf("node %q: %w", id, err)
		}
		s.nodes[id] = addr
	}
	for _, id := range sb.Removed {
		if err := ValidateNodeID(id); err != nil {
			return nil, fmt.Errorf("removed %w", err)
		}
		if _, ok := s.nodes[id]; ok {
			return nil, fmt.Errorf("node %q is both a member and removed", id)
		}
		s.removed[id] = true
	}
	if err := checkKeys(sb.Keys); err != nil {
		return nil, fmt.Errorf("signing %w", err)
	}
	s.keys = sb.Keys
	if err := s.restoreIdle(sb); err != nil {
		return nil, err
	}
	return s, nil
}

// restoreIdle restores the log format, the floor and the line of idle
// scopes of a state whose scopes are restored.
func (s *State) restoreIdle(sb snapshotBody) error {
	switch {
	case sb.Format > LogFormat:
		return fmt.Errorf("%w: a snapshot of log format %d; this build knows 1 to %d", ErrUnknownEntry, sb.Format, LogFormat)
	case sb.Format == 1 || sb.Format < 0:
		return fmt.Errorf("log format %d: format 1 is written as no format at all", sb.Format)
	case sb.Format == 0:
		if sb.Floor != 0 || len(sb.Idle) > 0 {
			return fmt.Errorf("a floor or idle scopes in a snapshot of log format 1")
		}
		return nil
	}
	if sb.Floor > fence.MaxToken {
		return fmt.Errorf("floor %d above the maximum token", sb.Floor)
	}
	s.format, s.floor = sb.Format, sb.Floor
	for _, name := range sb.Idle {
		sc := s.scopes[name]
		switch {
		case sc == nil:
			return fmt.Errorf("idle scope %q has no record", name)
		case !sc.droppable():
			return fmt.Errorf("idle scope %q is held or exhausted", name)
		case sc.idleSeq() != 0:
			return fmt.Errorf("idle scope %q appears twice", name)
		}
		s.queueIdle(name, sc)
	}
	free := 0
	for _, sc := range s.scopes {
		if sc.droppable() {
			free++
		}
	}
	if s.idle.Len() != free {
		return fmt.Errorf("%d idle scopes listed, %d free", s.idle.Len(), free)
	}
	return nil
}

// complete adds the current lease's grant to a frozen scope's ended
// grants, as the snapshot records them, unless they end with it already (a
// scope restored from a snapshot written before grants recorded their
// holder). It appends to buf rather than to the shared ended grants, and
// returns buf for the next scope.
func (r *snapshotScope) complete(buf []grant) []grant {
	n := len(r.Recent)
	if r.Lease == nil || n > 0 && r.Recent[n-1].Token == r.Lease.Token {
		return buf
	}
	buf = append(append(buf[:0], r.Recent...), grantOf(r.Lease))
	r.Recent = buf
	return buf
}

// restoreScope adds a scope of a snapshot to s, a state being restored.
func (s *State) restoreScope(r snapshotScope) error {
	if err := r.check(); err != nil {
		return fmt.Errorf("scope %q: %w", r.Scope, err)
	}
	if _, dup := s.scopes[r.Scope]; dup {
		return fmt.Errorf("scope %q appears twice", r.Scope)
	}
	if r.Lease != nil {
		r.Lease.Holder, r.Lease.Owner = intern(r.Lease.Holder), intern(r.Lease.Owner)
	}
	for i := range r.Waiters {
		r.Waiters[i].Holder, r.Waiters[i].Owner = intern(r.Waiters[i].Holder), intern(r.Waiters[i].Owner)
	}
	for i := range r.Recent {
		r.Recent[i].Holder = intern(r.Recent[i].Holder)
	}
	// A snapshot's recent grants end with the current lease's, which the
	// scope does not keep twice.
	ended := r.Recent
	if n := len(ended); r.Lease != nil {
		switch {
		case n > 0 && ended[n-1] == grantOf(r.Lease):
			ended = ended[:n-1]
		case n > 0 && ended[n-1].Token == r.Lease.Token:
			// Written before grants recorded their holder: kept as it was.
		default:
			// Not written by this state machine; with the current lease,
			// recentGrants at most.
			ended = ended[max(n-(recentGrants-1), 0):]
		}
	}
	if len(ended) == 0 {
		ended = nil
	}
	sc := &scope{last: r.Last, lease: r.Lease}
	if len(r.Waiters) > 0 || len(ended) > 0 {
		sc.more = &scopeMore{waiters: r.Waiters, ended: ended}
	}
	s.scopes[r.Scope] = sc
	if r.Lease != nil {
		s.held.ReplaceOrInsert(r.Scope)
	}
	return nil
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
