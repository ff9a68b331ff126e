// Package wire converts between fence's Go values and errors and the
// fence.v1 protobuf API, in both directions, so the server and the client
// agree on one table.
package wire

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// codes maps each sentinel to its wire code. Order matters only for errors
// that wrap several sentinels: the first match wins.
var codes = []struct {
	err  error
	code connect.Code
}{
	{fence.ErrInvalid, connect.CodeInvalidArgument},
	{fence.ErrHeld, connect.CodeAborted},
	{fence.ErrLeaseLost, connect.CodeFailedPrecondition},
	{fence.ErrNotHolder, connect.CodeNotFound},
	{fence.ErrTokensExhausted, connect.CodeResourceExhausted},
	{fence.ErrUnavailable, connect.CodeUnavailable},
	{fence.ErrMissedEvents, connect.CodeOutOfRange},
	{fence.ErrUnauthenticated, connect.CodeUnauthenticated},
	{fence.ErrPermissionDenied, connect.CodePermissionDenied},
	{fence.ErrUnimplemented, connect.CodeUnimplemented},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
	{context.Canceled, connect.CodeCanceled},
}

// ToConnect turns an error from the service into a *connect.Error with the
// matching code, the error's message and details a program can read.
func ToConnect(err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code := connect.CodeInternal
	for _, c := range codes {
		if errors.Is(err, c.err) {
			code = c.code
			break
		}
	}
	out := connect.NewError(code, err)
	var (
		inv  *fence.InvalidError
		held *fence.HeldError
		lost *fence.LostError
	)
	switch {
	case errors.As(err, &inv):
		addDetail(out, &fencev1.FieldViolation{Field: inv.Field, Description: inv.Reason})
	case errors.As(err, &held):
		addDetail(out, &fencev1.LeaseConflict{Scope: held.Scope, Holder: held.Holder, Token: held.Token, ExpiresIn: durationpb.New(held.ExpiresIn)})
	case errors.As(err, &lost):
		addDetail(out, &fencev1.LeaseConflict{Scope: lost.Scope, Token: lost.Current, LostToken: lost.Token, Reason: lost.Reason})
	}
	return out
}

func addDetail(e *connect.Error, m proto.Message) {
	if d, err := connect.NewErrorDetail(m); err == nil {
		e.AddDetail(d)
	}
}

// FromConnect turns an error from a call into the service back into fence's
// errors: sentinels for errors.Is, and *fence.InvalidError, *fence.HeldError
// or *fence.LostError when the details carry them. Transport failures
// become fence.ErrUnavailable. Every code of the table comes back as its
// sentinel, whether the service named the sentinel or answered the code
// alone (as its authorization and connect-go's own 404 do).
func FromConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	msg := ce.Message()
	var conflict *fencev1.LeaseConflict
	var field *fencev1.FieldViolation
	for _, d := range ce.Details() {
		switch v, _ := d.Value(); v := v.(type) {
		case *fencev1.LeaseConflict:
			conflict = v
		case *fencev1.FieldViolation:
			field = v
		}
	}
	switch ce.Code() {
	case connect.CodeInvalidArgument:
		if field != nil {
			return &fence.InvalidError{Field: field.Field, Reason: field.Description}
		}
		return withSentinel(fence.ErrInvalid, msg)
	case connect.CodeAborted:
		if conflict != nil {
			return &fence.HeldError{Scope: conflict.Scope, Holder: conflict.Holder, Token: conflict.Token, ExpiresIn: conflict.ExpiresIn.AsDuration()}
		}
		return withSentinel(fence.ErrHeld, msg)
	case connect.CodeResourceExhausted:
		// Connect's own limits (a request above the size limit) share the
		// code of an exhausted counter; only the service's answer, which
		// names the sentinel, is about tokens.
		if !strings.Contains(msg, fence.ErrTokensExhausted.Error()) {
			return err
		}
	case connect.CodeFailedPrecondition:
		if conflict != nil {
			return &fence.LostError{Scope: conflict.Scope, Token: conflict.LostToken, Current: conflict.Token, Reason: cmp.Or(conflict.Reason, "no longer the current lease")}
		}
		return withSentinel(fence.ErrLeaseLost, msg)
	}
	for _, c := range codes {
		if c.code == ce.Code() {
			return withSentinel(c.err, msg)
		}
	}
	return err
}

// ToFailure turns the error of one item of a batch into its wire form:
// what the single call would have answered for it.
func ToFailure(err error) *fencev1.RenewFailure {
	ce := ToConnect(err)
	f := &fencev1.RenewFailure{Code: ce.Code().String(), Message: ce.Message()}
	for _, d := range ce.Details() {
		if v, _ := d.Value(); v != nil {
			switch d := v.(type) {
			case *fencev1.LeaseConflict:
				f.Conflict = d
			case *fencev1.FieldViolation:
				f.Violation = d
			}
		}
	}
	return f
}

// FromFailure turns an item's failure in a batch back into the error the
// single call would have returned.
func FromFailure(f *fencev1.RenewFailure) error {
	var code connect.Code
	if err := code.UnmarshalText([]byte(f.GetCode())); err != nil {
		code = connect.CodeUnknown
	}
	ce := connect.NewError(code, errors.New(f.GetMessage()))
	if f.GetConflict() != nil {
		addDetail(ce, f.GetConflict())
	}
	if f.GetViolation() != nil {
		addDetail(ce, f.GetViolation())
	}
	return FromConnect(ce)
}

// withSentinel returns an error that matches sentinel and reads as the
// service's message, naming the sentinel only if the message does not.
func withSentinel(sentinel error, msg string) error {
	if strings.Contains(msg, sentinel.Error()) {
		return &wireError{msg: msg, sentinel: sentinel}
	}
	return fmt.Errorf("%w: %s", sentinel, msg)
}

// wireError is an error the service described in full.
type wireError struct {
	msg      string
	sentinel error
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.sentinel }

// Lease converts a lease record to its wire form. withID controls whether
// the lease ID is disclosed: only to the holder.
func Lease(l fence.Lease, grantedAt time.Time, withID bool) *fencev1.Lease {
	out := &fencev1.Lease{
		Scope:     l.Scope,
		Token:     l.Token,
		Holder:    l.Holder,
		Ttl:       durationpb.New(l.TTL),
		ExpiresIn: durationpb.New(l.ExpiresIn),
		TokenText: l.FencingToken().String(),
	}
	if !grantedAt.IsZero() {
		out.GrantedAt = timestamppb.New(grantedAt)
	}
	if withID {
		out.LeaseId = l.ID.String()
	}
	return out
}

// LeaseFrom converts a wire lease back. A missing or malformed lease ID is
// left zero.
func LeaseFrom(p *fencev1.Lease) fence.Lease {
	if p == nil {
		return fence.Lease{}
	}
	id, _ := fence.ParseLeaseID(p.LeaseId)
	l := fence.Lease{
		Scope:     p.Scope,
		Token:     p.Token,
		ID:        id,
		Holder:    p.Holder,
		TTL:       p.Ttl.AsDuration(),
		ExpiresIn: p.ExpiresIn.AsDuration(),
	}
	// A signed text form is kept only if it is the token of this very lease:
	// a scope's value is granted once, so scope and value identify it.
	if t, err := fence.ParseToken(p.TokenText); err == nil && t.Signed() && t.Scope == l.Scope && t.Value == l.Token {
		l.Signed = t
	}
	return l
}
