package server_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain checks that closed servers leave no goroutine behind: not the
// watch streams', not the status page's.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
