package guardtest

import (
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/signing"
)

// Forgeries returns, by name, tokens a verifying guard of genuine's scope
// must refuse without moving its mark: genuine is a token key signed, and
// other another scope. They are an unsigned token of the highest value,
// genuine with its value inflated or its scope re-labelled, a token signed
// by a key the guard does not trust, and a genuine token of other.
func Forgeries(key signing.PrivateKey, genuine fence.Token, other string) map[string]fence.Token {
	inflated, relabelled := genuine, genuine
	inflated.Value = fence.MaxToken
	relabelled.Scope = other
	return map[string]fence.Token{
		"unsigned":              {Scope: genuine.Scope, Value: fence.MaxToken},
		"inflated":              inflated,
		"signed by another key": signing.NewKey(time.Now()).Sign(fence.Token{Scope: genuine.Scope, Value: fence.MaxToken}),
		"re-labelled":           relabelled,
		"of another scope":      key.Sign(fence.Token{Scope: other, Value: fence.MaxToken}),
	}
}
