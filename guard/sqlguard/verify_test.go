package sqlguard_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/sqlguard"
	"github.com/fence-dev/fence/signing"
)

// forgeries returns what a verifying guard of genuine's scope must refuse:
// an unsigned token of 2^63−1, genuine inflated to it, a token of it signed
// by another key, genuine re-labelled for scope other, and a genuine token
// of key for other.
func forgeries(key signing.PrivateKey, genuine fence.Token, other string) map[string]fence.Token {
	inflated, relabelled := genuine, genuine
	inflated.Value = fence.MaxToken
	relabelled.Scope = other
	return map[string]fence.Token{
		"unsigned":              {Scope: genuine.Scope, Value: fence.MaxToken},
		"inflated":              inflated,
		"signed by another key": signing.NewKey(time.Now()).Sign(fence.Token{Scope: genuine.Scope, Value: fence.MaxToken, LeaseID: genuine.LeaseID}),
		"re-labelled":           relabelled,
		"of another scope":      key.Sign(fence.Token{Scope: other, Value: fence.MaxToken, LeaseID: fence.NewLeaseID()}),
	}
}

// TestVerifierKeepsMark: with WithVerifier, Update and UpdateRow accept a
// token the key signed, and no unsigned, inflated, forged or foreign token
// moves the fence table's mark or the row's token.
func TestVerifierKeepsMark(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		db, name := newDB(t, d, "_rows")
		rowTable(t, db, name+"_rows", 7)
		key := signing.NewKey(time.Now())
		s := newStore(t, db, d, sqlguard.WithTable(name), sqlguard.WithVerifier(signing.NewKeySet(key.Public())), quiet)
		row := sqlguard.Row{Table: name + "_rows", Key: "id", ID: 7}
		for _, p := range []struct {
			name string
			// scoped: the write is for "orders" whatever its token's scope.
			scoped bool
			write  func(tok fence.Token) error
			mark   func() (uint64, error)
		}{
			{"Update", true, func(tok fence.Token) error {
				return s.Update(ctx, "orders", guard.Write{Token: tok}, func(*sql.Tx) error { return nil })
			}, func() (uint64, error) {
				m, err := s.Highest(ctx, "orders")
				return m.Token, err
			}},
			{"UpdateRow", true, func(tok fence.Token) error {
				return updateRow(s, "orders", guard.Write{Token: tok}, row, map[string]any{"note": "x"})
			}, func() (tok uint64, err error) {
				err = db.QueryRowContext(ctx, "SELECT fence_token FROM "+row.Table+" WHERE id = 7").Scan(&tok)
				return tok, err
			}},
		} {
			t.Run(p.name, func(t *testing.T) {
				mark := func() uint64 {
					t.Helper()
					v, err := p.mark()
					if err != nil {
						t.Fatal(err)
					}
					return v
				}
				genuine := key.Sign(fence.Token{Scope: "orders", Value: 5, LeaseID: fence.NewLeaseID()})
				if err := p.write(genuine); err != nil || mark() != 5 {
					t.Fatalf("genuine token: %v, mark %d; want accepted, mark 5", err, mark())
				}
				for name, tok := range forgeries(key, genuine, "billing") {
					err := p.write(tok)
					if !errors.Is(err, fence.ErrInvalid) && (p.scoped || name != "of another scope") {
						t.Errorf("%s token: %v, want an invalid-token error", name, err)
					}
					if m := mark(); m != 5 {
						t.Fatalf("after the %s token the mark is %d, want 5", name, m)
					}
				}
			})
		}
	})
}
