package fence_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

var sentinels = []error{
	fence.ErrInvalid, fence.ErrHeld, fence.ErrLeaseLost, fence.ErrNotHolder,
	fence.ErrStale, fence.ErrTokensExhausted, fence.ErrUnavailable, fence.ErrMissedEvents, fence.ErrClosed,
	fence.ErrUnauthenticated, fence.ErrPermissionDenied, fence.ErrUnimplemented,
}

// wrappings are the ways a caller receives an error: as is, wrapped once
// or twice with %w, or joined with another error.
var wrappings = []struct {
	name string
	wrap func(error) error
}{
	{"bare", func(err error) error { return err }},
	{"wrapped", func(err error) error { return fmt.Errorf("acquire %q: %w", "orders", err) }},
	{"wrapped twice", func(err error) error {
		return fmt.Errorf("run job: %w", fmt.Errorf("acquire %q: %w", "orders", err))
	}},
	{"joined", func(err error) error { return errors.Join(errors.New("closing: broken pipe"), err) }},
}

// structured returns what errors.As finds in err for the type of like.
func structured(err, like error) error {
	switch like.(type) {
	case *fence.InvalidError:
		var e *fence.InvalidError
		if errors.As(err, &e) {
			return e
		}
	case *fence.HeldError:
		var e *fence.HeldError
		if errors.As(err, &e) {
			return e
		}
	case *fence.LostError:
		var e *fence.LostError
		if errors.As(err, &e) {
			return e
		}
	}
	return nil
}

func TestStructuredErrorsMatchTheirSentinel(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error // its sentinel
	}{
		{&fence.InvalidError{Field: "ttl", Reason: "0s is not positive"}, fence.ErrInvalid},
		{&fence.HeldError{Scope: "orders", Holder: "w", Token: 41, ExpiresIn: time.Second}, fence.ErrHeld},
		{&fence.LostError{Scope: "orders", Token: 41, Current: 42}, fence.ErrLeaseLost},
	} {
		for _, w := range wrappings {
			err := w.wrap(tc.err)
			if !errors.Is(err, tc.want) {
				t.Errorf("%s %T: errors.Is(%v) = false", w.name, tc.err, tc.want)
			}
			for _, other := range sentinels {
				if other != tc.want && errors.Is(err, other) {
					t.Errorf("%s %T: also matches %v", w.name, tc.err, other)
				}
			}
			if got := structured(err, tc.err); got != tc.err {
				t.Errorf("%s %T: errors.As finds %v, want the error itself", w.name, tc.err, got)
			}
		}
	}
	// A plain sentinel is not a structured error.
	if got := structured(fmt.Errorf("x: %w", fence.ErrHeld), &fence.HeldError{}); got != nil {
		t.Errorf("errors.As found %v in a wrapped ErrHeld", got)
	}
}

func TestSentinelsAreDistinct(t *testing.T) {
	msgs := map[string]bool{}
	for i, a := range sentinels {
		if msgs[a.Error()] {
			t.Errorf("two sentinels read %q", a)
		}
		msgs[a.Error()] = true
		for _, b := range sentinels[i+1:] {
			if errors.Is(a, b) || errors.Is(b, a) {
				t.Errorf("%v and %v match each other", a, b)
			}
		}
	}
}

func TestErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&fence.InvalidError{Field: "ttl", Reason: "0s is not positive"}, "invalid ttl: 0s is not positive"},
		{&fence.HeldError{Scope: "orders", Holder: "worker-3@host", Token: 41, ExpiresIn: 7*time.Second + 300*time.Microsecond},
			`scope "orders" is held by "worker-3@host" with token 41, 7s left`},
		{&fence.HeldError{Scope: "a", Holder: "", Token: 1, ExpiresIn: 1500 * time.Microsecond},
			`scope "a" is held by "" with token 1, 2ms left`},
		{&fence.LostError{Scope: "orders"}, `lease on "orders" is lost`},
		{&fence.LostError{Scope: "orders", Token: 41, Current: 42, Reason: "expired"},
			`lease on "orders" with token 41 is lost: expired (current token 42)`},
		{&fence.LostError{Scope: "orders", Token: 41, Reason: "released"}, `lease on "orders" with token 41 is lost: released`},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%T.Error() = %q, want %q", tc.err, got, tc.want)
		}
	}
}
