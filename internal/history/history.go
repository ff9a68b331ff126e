// Package history records what the processes of a fencecheck run did and
// checks the record: the fencing rule held at the resource, grant tokens
// only grew, the guarded register was linearizable, and no acknowledged
// write was lost.
//
// # Usage
//
// Each process appends Events to its own file with a Writer; the run
// merges them into one file, and Check reads it back:
//
//	evs, err := history.ReadFile("history.jsonl")
//	r := history.Check(evs, history.Options{})
//	r.Write(os.Stdout) // ends with "anomalies: N"
//
// # The register
//
// The resource is one register per scope. A worker holding a scope's
// lease reads the register and writes a new value computed from what it
// read, both with its token: a read-modify-write. A value is
// "N/OPID": a version and the ID of the write that set it, so every
// written value is unique and names its writer. The checker models a write
// as what the worker meant, "replace FROM by TO", and a read as returning
// the current value; a guarded resource behaves like that model because
// the fence refuses a write once any newer holder has been served.
//
// # Caveats
//
// Times compared across processes are CLOCK_MONOTONIC readings (Event.Mono),
// so a history is only meaningful for processes of one machine.
package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Type is what an Event records.
type Type string

// The event types. An operation is an invoke followed by one completion
// (ok, fail or info) of the same Proc and Op.
const (
	Invoke Type = "invoke" // an operation starts; written before the request is sent
	OK     Type = "ok"     // it completed and took effect
	Fail   Type = "fail"   // it completed and certainly took no effect (Reason says why)
	Info   Type = "info"   // its outcome is unknown: it may or may not have taken effect

	Fault   Type = "fault"   // the nemesis injected or healed a fault (F is its kind)
	Applied Type = "applied" // the resource's own log: it applied Ref's operation at Index
	Final   Type = "final"   // the register's value (Value) and the service's last token (Token) after the run
	Meta    Type = "meta"    // the run's parameters, in Detail
	Note    Type = "note"    // how a fault ended (F is its kind, Detail says how); not counted as a fault
	// End is the service's record that a lease ended: F is "released" or
	// "expired", Token the lease's token, Closing its closing token, and
	// Wall when the service recorded it (Mono is derived from Wall).
	End Type = "end"
)

// Operation names (Event.F) of the workers.
const (
	Acquire = "acquire"
	Renew   = "renew"
	Release = "release"
	Read    = "read"
	Write   = "write"
	// Mark is the resource's record (an Applied event) that a follower
	// advanced the scope's mark to Token, writing nothing.
	Mark = "mark"
)

// Reasons of failed and unknown completions (Event.Reason).
const (
	ReasonStale   = "stale"   // the guard refused the token
	ReasonHeld    = "held"    // another holder has the scope
	ReasonLost    = "lost"    // the service says the lease is no longer current
	ReasonTimeout = "timeout" // no answer in time
	ReasonError   = "error"   // any other error
)

// Event is one line of a history file.
type Event struct {
	Type  Type   `json:"type"`
	Proc  string `json:"proc"`            // w1, w2, ...; nemesis; resource; checker
	Op    int64  `json:"op,omitempty"`    // per-process operation number, shared by invoke and completion
	F     string `json:"f,omitempty"`     // operation name, or fault kind
	Scope string `json:"scope,omitempty"` // the scope (the register) it concerns
	Token uint64 `json:"token,omitempty"` // the fencing token presented, granted or applied
	Seq   uint64 `json:"seq,omitempty"`   // the sequence number within the token's epoch
	Value string `json:"value,omitempty"` // write: the new value; read and applied: the value returned
	From  string `json:"from,omitempty"`  // write: the value read before, which it replaces
	Index uint64 `json:"index,omitempty"` // applied: the resource's per-scope order
	// Closing is, for End, the token the end of the lease consumed, which
	// a follower advances the resource's mark to.
	Closing uint64    `json:"closing,omitempty"`
	Ref     string    `json:"ref,omitempty"` // applied: the operation's ID, PROC.OP
	Reason  string    `json:"reason,omitempty"`
	Err     string    `json:"err,omitempty"`
	Detail  string    `json:"detail,omitempty"`
	Wall    time.Time `json:"wall"`
	Mono    int64     `json:"mono"` // CLOCK_MONOTONIC in nanoseconds: comparable across processes of one machine
}

// ID returns the operation's ID, PROC.OP, which a write puts in its value
// and the resource's log repeats in Ref.
func (e Event) ID() string { return OpID(e.Proc, e.Op) }

// OpID returns the ID of operation op of process proc.
func OpID(proc string, op int64) string { return fmt.Sprintf("%s.%d", proc, op) }

// Writer appends events to a file as JSON lines, one write call per
// event, stamping each with the wall and monotonic time if unset. It is
// safe for concurrent use.
type Writer struct {
	mu  sync.Mutex
	f   *os.File
	err error
}

// Create creates (or truncates) the history file at path.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f}, nil
}

// Add writes e, filling in Wall and Mono when they are zero, and returns
// the event as written. The first write error is kept for Close.
func (w *Writer) Add(e Event) Event {
	if e.Mono == 0 {
		e.Wall, e.Mono = Now()
	}
	b, err := json.Marshal(e)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		_, err = w.f.Write(append(b, '\n'))
	}
	if w.err == nil {
		w.err = err
	}
	return e
}

// Close closes the file and returns the first error of any write.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.f.Close(); w.err == nil {
		w.err = err
	}
	return w.err
}

// Decode reads a history of JSON lines. A torn last line (a process killed
// while writing) is ignored; any other malformed line is an error.
func Decode(r io.Reader) ([]Event, error) {
	var evs []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var bad error
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		if bad != nil {
			return nil, bad
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			bad = fmt.Errorf("line %d: %w", line, err)
			continue
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}

// ReadFile reads the history file at path.
func ReadFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	evs, err := Decode(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return evs, nil
}
