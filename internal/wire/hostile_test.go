package wire_test

import (
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/wire"
)

// TestOversizedRequestIsNotExhaustion: Connect answers a request above the
// server's size limit with resource_exhausted, the code of an exhausted
// token counter. The client must not read it as one: a caller told its
// scope's tokens are exhausted would give up on the scope for good.
func TestOversizedRequestIsNotExhaustion(t *testing.T) {
	in := connect.NewError(connect.CodeResourceExhausted, errors.New("message size 1048640 is larger than configured max 65536"))
	err := wire.FromConnect(in)
	if errors.Is(err, fence.ErrTokensExhausted) {
		t.Errorf("FromConnect(%v) = %v, which matches ErrTokensExhausted", in, err)
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("FromConnect(%v) = %v, want the resource_exhausted error as it came", in, err)
	}
}
