package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/fence-dev/fence"
)

// leaseJSON is a lease in -o json output.
type leaseJSON struct {
	Scope       string `json:"scope"`
	Token       uint64 `json:"token"`
	TokenText   string `json:"token_text"`
	LeaseID     string `json:"lease_id,omitempty"` // only where the service discloses it
	Holder      string `json:"holder"`
	TTLMs       int64  `json:"ttl_ms"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

func leaseOut(l fence.Lease) *leaseJSON {
	out := &leaseJSON{
		Scope:       l.Scope,
		Token:       l.Token,
		TokenText:   l.FencingToken().String(),
		Holder:      l.Holder,
		TTLMs:       l.TTL.Milliseconds(),
		ExpiresInMs: l.ExpiresIn.Milliseconds(),
	}
	if !l.ID.IsZero() {
		out.LeaseID = l.ID.String()
	}
	return out
}

// errorJSON is a failure in -o json output.
type errorJSON struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	ExitStatus int    `json:"exit_status"`

	// For code "held": the lease in the way.
	Scope       string `json:"scope,omitempty"`
	Holder      string `json:"holder,omitempty"`
	Token       uint64 `json:"token,omitempty"`
	ExpiresInMs *int64 `json:"expires_in_ms,omitempty"`

	// For codes "invalid" and "usage" from a field check.
	Field string `json:"field,omitempty"`
}

func errorOut(err error, code string, status int) errorJSON {
	out := errorJSON{Error: err.Error(), Code: code, ExitStatus: status}
	var held *fence.HeldError
	var inv *fence.InvalidError
	if errors.As(err, &held) {
		ms := held.ExpiresIn.Milliseconds()
		out.Scope, out.Holder, out.Token, out.ExpiresInMs = held.Scope, held.Holder, held.Token, &ms
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

func (a *app) writeJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// dur formats a duration for people, to the millisecond.
func dur(d time.Duration) string { return d.Round(time.Millisecond).String() }

// leaseText is the text form of a lease the caller holds.
func leaseText(l fence.Lease) string {
	return fmt.Sprintf("%s token %d (%s) lease %s holder %q; ttl %s",
		l.Scope, l.Token, l.FencingToken(), l.ID, l.Holder, dur(l.TTL))
}
