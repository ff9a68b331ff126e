package fence_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/fence-dev/fence"
)

func ExampleToken() {
	tok := fence.Token{Scope: "orders/shard-7", Value: 42}
	fmt.Println(tok)

	back, err := fence.ParseToken("fence:v1:orders/shard-7:42")
	fmt.Println(back == tok, err)

	_, err = fence.ParseToken("fence:v1:orders:042")
	fmt.Println(err)
	// Output:
	// fence:v1:orders/shard-7:42
	// true <nil>
	// invalid token: value "042" must be from 1 to 9223372036854775807 without leading zeros
}

func ExampleHeldError() {
	var err error = fmt.Errorf("acquire %q: %w", "orders",
		&fence.HeldError{Scope: "orders", Holder: "worker-3@host", Token: 41, ExpiresIn: 7 * time.Second})

	var held *fence.HeldError
	if errors.As(err, &held) {
		fmt.Println("held by", held.Holder, "with token", held.Token)
	}
	fmt.Println(errors.Is(err, fence.ErrHeld))
	// Output:
	// held by worker-3@host with token 41
	// true
}
