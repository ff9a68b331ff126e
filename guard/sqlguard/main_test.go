package sqlguard_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every test closes the databases it opens: a
// *sql.DB left open keeps a goroutine.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
