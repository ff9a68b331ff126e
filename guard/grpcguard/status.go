package grpcguard

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// StaleReason and Domain identify a stale rejection: the Reason and Domain
// of the google.rpc.ErrorInfo detail of its FAILED_PRECONDITION status.
// Clients in any language can tell a stale token from other failed
// preconditions by them, without fence's protos.
const (
	StaleReason = "STALE_FENCING_TOKEN"
	Domain      = "fence.dev"
)

// The ErrorInfo metadata keys of a stale rejection. The sequence keys are
// present only when the rejected write carried a sequence number.
const (
	scopeKey             = "scope"
	presentedTokenKey    = "presented_token"
	highestTokenKey      = "highest_token"
	presentedSequenceKey = "presented_sequence"
	highestSequenceKey   = "highest_sequence"
)

// statusError turns an error of guard.Fence into the status a caller can
// act on. field names the metadata key a bad token came from.
func statusError(field string, err error) error {
	var stale *guard.StaleError
	switch {
	case errors.As(err, &stale):
		return staleStatus(stale).Err()
	case errors.Is(err, fence.ErrInvalid):
		return invalidArgument(field, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Internal, "grpcguard: fencing check failed: %v", err)
}

func staleStatus(stale *guard.StaleError) *status.Status {
	md := map[string]string{
		scopeKey:          stale.Scope,
		presentedTokenKey: strconv.FormatUint(stale.Presented, 10),
		highestTokenKey:   strconv.FormatUint(stale.Highest, 10),
	}
	if stale.PresentedSeq != 0 || stale.HighestSeq != 0 {
		md[presentedSequenceKey] = strconv.FormatUint(stale.PresentedSeq, 10)
		md[highestSequenceKey] = strconv.FormatUint(stale.HighestSeq, 10)
	}
	return withDetail(status.New(codes.FailedPrecondition, stale.Error()),
		&errdetails.ErrorInfo{Reason: StaleReason, Domain: Domain, Metadata: md})
}

func invalidArgument(field, description string) error {
	return withDetail(status.New(codes.InvalidArgument, description), &errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: description}},
	}).Err()
}

// withDetail adds d to st, or leaves st without it if d cannot be
// marshalled: the code and message still say what happened.
func withDetail(st *status.Status, d protoadapt.MessageV1) *status.Status {
	if withD, err := st.WithDetails(d); err == nil {
		return withD
	}
	return st
}

// FromError reports whether err is a guard's stale rejection, and which:
// an error of this package's client interceptors, or any gRPC status error
// carrying the stale ErrorInfo (a call made without the interceptors).
// Numbers missing from the detail are left zero.
func FromError(err error) (*guard.StaleError, bool) {
	var stale *guard.StaleError
	if errors.As(err, &stale) {
		return stale, true
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return nil, false
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetReason() != StaleReason || info.GetDomain() != Domain {
			continue
		}
		md := info.GetMetadata()
		num := func(key string) uint64 {
			n, _ := strconv.ParseUint(md[key], 10, 64)
			return n
		}
		return &guard.StaleError{
			Scope:        md[scopeKey],
			Presented:    num(presentedTokenKey),
			Highest:      num(highestTokenKey),
			PresentedSeq: num(presentedSequenceKey),
			HighestSeq:   num(highestSequenceKey),
		}, true
	}
	return nil, false
}
