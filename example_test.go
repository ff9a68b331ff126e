package fence_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/fence-dev/fence"
)

func ExampleToken_String() {
	tok := fence.Token{Scope: "orders/shard-7", Value: 42}
	fmt.Println(tok)
	// Output:
	// fence:v1:orders/shard-7:42
}

func ExampleParseToken() {
	tok, err := fence.ParseToken("fence:v1:orders/shard-7:42")
	if err != nil {
		panic(err)
	}
	fmt.Println(tok.Scope, tok.Value)

	// Only the canonical form parses; the error says what is allowed.
	_, err = fence.ParseToken("fence:v1:orders/shard-7:042")
	fmt.Println(err)
	fmt.Println(errors.Is(err, fence.ErrInvalid))
	// Output:
	// orders/shard-7 42
	// invalid token: value "042" must be from 1 to 9223372036854775807 without leading zeros
	// true
}

func ExampleHeldError() {
	// What an acquire of a held scope returns, wrapped by the caller.
	var err error = &fence.HeldError{Scope: "orders", Holder: "worker-3@host", Token: 41, ExpiresIn: 7 * time.Second}
	err = fmt.Errorf("run nightly export: %w", err)

	var held *fence.HeldError
	if errors.As(err, &held) {
		fmt.Printf("%s holds %s with token %d for %v more\n", held.Holder, held.Scope, held.Token, held.ExpiresIn)
	}
	fmt.Println(errors.Is(err, fence.ErrHeld))
	fmt.Println(err)
	// Output:
	// worker-3@host holds orders with token 41 for 7s more
	// true
	// run nightly export: scope "orders" is held by "worker-3@host" with token 41, 7s left
}
