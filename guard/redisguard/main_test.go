package redisguard_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every test closes the go-redis clients it opens.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
