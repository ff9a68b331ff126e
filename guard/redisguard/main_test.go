package redisguard_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every test closes the go-redis clients it opens.
func TestMain(m *testing.M) {
	skipExamplesWithoutServer() // example_server_test.go
	goleak.VerifyTestMain(m)
}
