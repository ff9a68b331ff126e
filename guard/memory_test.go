package guard_test

import (
	"testing"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
)

func TestMemoryStore(t *testing.T) {
	guardtest.Run(t, guardtest.Harness{
		Open: func(t *testing.T) guard.Store { return guard.NewMemoryStore() },
	})
}
