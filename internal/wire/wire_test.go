package wire_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/wire"
)

// TestMain checks that the in-process servers of the round trips below
// leave no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// errorCase is one error the service returns, with the wire code the table
// documents for it and what a client must be able to read back.
type errorCase struct {
	name     string
	err      error
	code     connect.Code
	sentinel error
	// want is the structured error FromConnect must rebuild, nil if only
	// the sentinel is carried.
	want error
}

func errorCases() []errorCase {
	return []errorCase{
		{
			name:     "invalid",
			err:      &fence.InvalidError{Field: "scope", Reason: "empty; want 1 to 256 bytes"},
			code:     connect.CodeInvalidArgument,
			sentinel: fence.ErrInvalid,
			want:     &fence.InvalidError{Field: "scope", Reason: "empty; want 1 to 256 bytes"},
		},
		{
			name:     "invalid wrapped",
			err:      fmt.Errorf("acquire %q: %w", "x", &fence.InvalidError{Field: "ttl", Reason: "1ns is outside the allowed range"}),
			code:     connect.CodeInvalidArgument,
			sentinel: fence.ErrInvalid,
			want:     &fence.InvalidError{Field: "ttl", Reason: "1ns is outside the allowed range"},
		},
		{
			name:     "invalid sentinel",
			err:      fmt.Errorf("%w: bad page token", fence.ErrInvalid),
			code:     connect.CodeInvalidArgument,
			sentinel: fence.ErrInvalid,
		},
		{
			name:     "held",
			err:      &fence.HeldError{Scope: "orders", Holder: "worker-1@host", Token: 42, ExpiresIn: 1234567891 * time.Nanosecond},
			code:     connect.CodeAborted,
			sentinel: fence.ErrHeld,
			want:     &fence.HeldError{Scope: "orders", Holder: "worker-1@host", Token: 42, ExpiresIn: 1234567891 * time.Nanosecond},
		},
		{
			name:     "lost",
			err:      &fence.LostError{Scope: "orders", Token: 41, Current: 42, Reason: "it expired, was released or was superseded"},
			code:     connect.CodeFailedPrecondition,
			sentinel: fence.ErrLeaseLost,
			// The reason is for people and is not carried as a field: the
			// message carries it.
			want: &fence.LostError{Scope: "orders", Token: 41, Current: 42},
		},
		{
			name:     "lost, scope free",
			err:      &fence.LostError{Scope: "orders", Token: 41},
			code:     connect.CodeFailedPrecondition,
			sentinel: fence.ErrLeaseLost,
			want:     &fence.LostError{Scope: "orders", Token: 41},
		},
		{
			name:     "not holder",
			err:      fmt.Errorf("%w: scope %q has no current or recent lease with that ID", fence.ErrNotHolder, "orders"),
			code:     connect.CodeNotFound,
			sentinel: fence.ErrNotHolder,
		},
		{
			name:     "tokens exhausted",
			err:      fmt.Errorf("%w: scope %q issued token %d, the maximum", fence.ErrTokensExhausted, "orders", uint64(fence.MaxToken)),
			code:     connect.CodeResourceExhausted,
			sentinel: fence.ErrTokensExhausted,
		},
		{
			name:     "unavailable",
			err:      fmt.Errorf("%w: not ready (starting up, or not the leader); retry shortly", fence.ErrUnavailable),
			code:     connect.CodeUnavailable,
			sentinel: fence.ErrUnavailable,
		},
		{
			name:     "missed events",
			err:      fmt.Errorf("%w: position 7 is no longer retained", fence.ErrMissedEvents),
			code:     connect.CodeOutOfRange,
			sentinel: fence.ErrMissedEvents,
		},
		{
			name:     "unauthenticated",
			err:      fmt.Errorf("%w: this service needs credentials: a client certificate or a bearer token", fence.ErrUnauthenticated),
			code:     connect.CodeUnauthenticated,
			sentinel: fence.ErrUnauthenticated,
		},
		{
			name:     "permission denied",
			err:      fmt.Errorf("%w: %q may not %s %q", fence.ErrPermissionDenied, "worker", "acquire", "billing/1"),
			code:     connect.CodePermissionDenied,
			sentinel: fence.ErrPermissionDenied,
		},
		{
			name:     "unimplemented",
			err:      fmt.Errorf("%w: fence.v1.LeaseService.AcquireBatch", fence.ErrUnimplemented),
			code:     connect.CodeUnimplemented,
			sentinel: fence.ErrUnimplemented,
		},
		{
			name:     "deadline exceeded",
			err:      fmt.Errorf("wait for %q: %w", "orders", context.DeadlineExceeded),
			code:     connect.CodeDeadlineExceeded,
			sentinel: context.DeadlineExceeded,
		},
		{
			name:     "canceled",
			err:      fmt.Errorf("wait for %q: %w", "orders", context.Canceled),
			code:     connect.CodeCanceled,
			sentinel: context.Canceled,
		},
	}
}

// allSentinels are the errors a client tells apart; a round trip must
// match exactly one of them.
var allSentinels = []error{
	fence.ErrInvalid, fence.ErrHeld, fence.ErrLeaseLost, fence.ErrNotHolder, fence.ErrStale,
	fence.ErrTokensExhausted, fence.ErrUnavailable, fence.ErrMissedEvents, context.DeadlineExceeded, context.Canceled,
	fence.ErrUnauthenticated, fence.ErrPermissionDenied, fence.ErrUnimplemented,
}

// checkRoundTrip checks what FromConnect made of a case's error.
func checkRoundTrip(t *testing.T, tc errorCase, got error) {
	t.Helper()
	for _, s := range allSentinels {
		if want := s == tc.sentinel; errors.Is(got, s) != want {
			t.Errorf("errors.Is(%v, %v) = %t, want %t", got, s, !want, want)
		}
	}
	var ce *connect.Error
	if errors.As(got, &ce) {
		t.Errorf("FromConnect returned a *connect.Error: %v", got)
	}
	if tc.want == nil {
		return
	}
	var gotFields any
	switch tc.want.(type) {
	case *fence.InvalidError:
		var e *fence.InvalidError
		if errors.As(got, &e) {
			gotFields = e
		}
	case *fence.HeldError:
		var e *fence.HeldError
		if errors.As(got, &e) {
			gotFields = e
		}
	case *fence.LostError:
		var e *fence.LostError
		if errors.As(got, &e) {
			e2 := *e
			e2.Reason = "" // not carried; see the case
			gotFields = &e2
		}
	}
	if gotFields == nil {
		t.Fatalf("%v (%T): want a %T", got, got, tc.want)
	}
	if diff := cmp.Diff(tc.want, gotFields); diff != "" {
		t.Errorf("fields after the round trip (-want +got):\n%s", diff)
	}
}

// TestCodes: ToConnect gives each error its documented code and keeps its
// message; FromConnect turns it back into an error that matches the same
// sentinel, with the same structured fields.
func TestCodes(t *testing.T) {
	for _, tc := range errorCases() {
		t.Run(tc.name, func(t *testing.T) {
			ce := wire.ToConnect(tc.err)
			if ce.Code() != tc.code {
				t.Errorf("ToConnect code = %v, want %v", ce.Code(), tc.code)
			}
			if ce.Message() != tc.err.Error() {
				t.Errorf("ToConnect message = %q, want %q", ce.Message(), tc.err.Error())
			}
			checkRoundTrip(t, tc, wire.FromConnect(ce))
		})
	}
}

// TestUnknownErrors: an error outside the table is Internal and matches no
// sentinel on the way back; errors that are already *connect.Error pass
// through; nil stays nil.
func TestUnknownErrors(t *testing.T) {
	ce := wire.ToConnect(errors.New("disk on fire"))
	if ce.Code() != connect.CodeInternal {
		t.Errorf("code = %v, want internal", ce.Code())
	}
	back := wire.FromConnect(ce)
	for _, s := range allSentinels {
		if errors.Is(back, s) {
			t.Errorf("FromConnect(internal) matches %v", s)
		}
	}
	orig := connect.NewError(connect.CodePermissionDenied, errors.New("no"))
	if got := wire.ToConnect(fmt.Errorf("wrapped: %w", orig)); got != orig {
		t.Errorf("ToConnect of a wrapped *connect.Error = %v, want it unchanged", got)
	}
	if err := wire.FromConnect(nil); err != nil {
		t.Errorf("FromConnect(nil) = %v", err)
	}
	plain := errors.New("dial tcp: refused")
	if err := wire.FromConnect(plain); err != plain {
		t.Errorf("FromConnect(non-connect error) = %v, want it unchanged", err)
	}
}

// TestBareCodes: an error the service answers with a code of the table
// but without naming the sentinel (its authorization returns
// *connect.Error as it is, connect-go answers a path it does not serve
// with Unimplemented) comes back as that code's sentinel all the same,
// with its message, alone or as one item of a batch.
func TestBareCodes(t *testing.T) {
	for _, tc := range []struct {
		err      *connect.Error
		sentinel error
	}{
		{connect.NewError(connect.CodeUnauthenticated, errors.New("this service needs credentials: a client certificate or a bearer token")), fence.ErrUnauthenticated},
		{connect.NewError(connect.CodePermissionDenied, errors.New(`"worker" may not acquire "billing/1"`)), fence.ErrPermissionDenied},
		{connect.NewError(connect.CodeUnimplemented, errors.New("HTTP status 404 Not Found")), fence.ErrUnimplemented},
	} {
		t.Run(tc.err.Code().String(), func(t *testing.T) {
			if got := wire.ToConnect(tc.err); got.Code() != tc.err.Code() {
				t.Errorf("ToConnect code = %v, want %v", got.Code(), tc.err.Code())
			}
			for _, got := range []error{wire.FromConnect(tc.err), wire.FromFailure(wire.ToFailure(tc.err))} {
				checkRoundTrip(t, errorCase{sentinel: tc.sentinel}, got)
				if !strings.Contains(got.Error(), tc.err.Message()) {
					t.Errorf("%q lost the message %q", got, tc.err.Message())
				}
			}
		})
	}
}

// TestFromConnectMessage: an error that comes back as a sentinel keeps the
// service's words and names the sentinel once. The service's message
// usually names it already, and a person reading "renew "orders": not the
// lease holder: not the lease holder: scope …" should not see it twice.
func TestFromConnectMessage(t *testing.T) {
	for _, tc := range errorCases() {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want != nil {
				return // a structured error writes its own message
			}
			got := wire.FromConnect(wire.ToConnect(tc.err)).Error()
			if n := strings.Count(got, tc.sentinel.Error()); n != 1 {
				t.Errorf("message %q names %q %d times, want once", got, tc.sentinel, n)
			}
			if !strings.Contains(got, tc.err.Error()) {
				t.Errorf("message %q lost the service's message %q", got, tc.err)
			}
		})
	}
}

// TestRoundTripOverTheWire sends each error through a real ConnectRPC
// server and client, in each protocol, so the details are serialised and
// parsed as they are between fenced and its clients.
func TestRoundTripOverTheWire(t *testing.T) {
	cases := errorCases()
	const procedure = "/fence.test.v1.Errors/Fail"
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure,
		func(_ context.Context, req *connect.Request[emptypb.Empty]) (*connect.Response[emptypb.Empty], error) {
			name := req.Header().Get("Case")
			for _, tc := range cases {
				if tc.name == name {
					return nil, wire.ToConnect(tc.err)
				}
			}
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("no case %q", name))
		}))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}

	for _, proto := range []struct {
		name string
		opts []connect.ClientOption
	}{
		{"connect", nil},
		{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
		{"grpc", []connect.ClientOption{connect.WithGRPC()}},
		{"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}},
	} {
		client := connect.NewClient[emptypb.Empty, emptypb.Empty](hc, srv.URL+procedure, proto.opts...)
		for _, tc := range cases {
			t.Run(proto.name+"/"+tc.name, func(t *testing.T) {
				req := connect.NewRequest(&emptypb.Empty{})
				req.Header().Set("Case", tc.name)
				_, err := client.CallUnary(context.Background(), req)
				if !connect.IsWireError(err) {
					t.Fatalf("call = %v, want an error from the server", err)
				}
				if got := connect.CodeOf(err); got != tc.code {
					t.Errorf("code = %v, want %v", got, tc.code)
				}
				checkRoundTrip(t, tc, wire.FromConnect(err))
			})
		}
	}
}
