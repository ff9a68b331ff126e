package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/wire"
)

// -o json prints the API's shape: what the API answers for the same call,
// in protobuf's JSON mapping (protojson), so that a script reads fencectl
// and the API alike: lowerCamelCase names (leaseId, lastToken), 64-bit
// integers as strings ("token": "1796612995909417", which no JSON reader
// rounds), durations as strings of seconds ("ttl": "10s"), enums by name
// (EVENT_KIND_GRANTED), and fields at their zero value left out. Where no
// call answers the same, the object follows the same rules.

// leaseOut is a lease in the API's form: its ID only if fencectl has it
// (acquire, renew), its signed token text if the service signed it.
func leaseOut(l fence.Lease) *fencev1.Lease {
	return wire.Lease(l, time.Time{}, !l.ID.IsZero())
}

// errorJSON is a failure in -o json output.
type errorJSON struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	ExitStatus int    `json:"exitStatus"`

	// For code "held": the lease in the way.
	Scope     string `json:"scope,omitempty"`
	Holder    string `json:"holder,omitempty"`
	Token     uint64 `json:"token,omitempty,string"`
	ExpiresIn string `json:"expiresIn,omitempty"` // as protojson writes a Duration

	// For codes "invalid" and "usage" from a field check.
	Field string `json:"field,omitempty"`
}

func errorOut(err error, code string, status int) errorJSON {
	out := errorJSON{Error: err.Error(), Code: code, ExitStatus: status}
	var held *fence.HeldError
	var inv *fence.InvalidError
	if errors.As(err, &held) {
		out.Scope, out.Holder, out.Token, out.ExpiresIn = held.Scope, held.Holder, held.Token, durationJSON(held.ExpiresIn)
	}
	if errors.As(err, &inv) {
		out.Field = inv.Field
	}
	return out
}

// emit writes a command's result: v as JSON, or text for people.
func (a *app) emit(v any, text func(w io.Writer)) error {
	if a.output == "json" {
		return a.writeJSON(v)
	}
	text(a.stdout)
	return nil
}

// writeJSON writes v on one line: a protobuf message with protojson, as the
// API does, anything else with encoding/json.
func (a *app) writeJSON(v any) error {
	var b []byte
	var err error
	if m, ok := v.(proto.Message); ok {
		b, err = protojson.Marshal(m)
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		return err
	}
	// protojson varies its spacing on purpose, from build to build; one
	// compact line is what scripts get.
	var line bytes.Buffer
	if err := json.Compact(&line, b); err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", line.Bytes())
	return err
}

// durationJSON is d as protojson writes a google.protobuf.Duration: seconds
// with 0, 3, 6 or 9 decimals, then "s" ("1.500s").
func durationJSON(d time.Duration) string {
	b, _ := protojson.Marshal(durationpb.New(d))
	var s string
	_ = json.Unmarshal(b, &s)
	return s
}

// dur formats a duration for people, to the millisecond.
func dur(d time.Duration) string { return d.Round(time.Millisecond).String() }

// leaseText is the text form of a lease the caller holds.
func leaseText(l fence.Lease) string {
	return fmt.Sprintf("%s token %d (%s) lease %s holder %q; ttl %s",
		l.Scope, l.Token, l.FencingToken(), l.ID, l.Holder, dur(l.TTL))
}
