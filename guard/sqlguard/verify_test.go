package sqlguard_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/sqlguard"
	"github.com/fence-dev/fence/signing"
)

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
			name  string
			write func(tok fence.Token) error
			mark  func() (uint64, error)
		}{
			{"Update", func(tok fence.Token) error {
				return s.Update(ctx, "orders", guard.Write{Token: tok}, func(*sql.Tx) error { return nil })
			}, func() (uint64, error) {
				m, err := s.Highest(ctx, "orders")
				return m.Token, err
			}},
			{"UpdateRow", func(tok fence.Token) error {
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
				genuine := key.Sign(fence.Token{Scope: "orders", Value: 5})
				if err := p.write(genuine); err != nil || mark() != 5 {
					t.Fatalf("genuine token: %v, mark %d; want accepted, mark 5", err, mark())
				}
				for name, tok := range guardtest.Forgeries(key, genuine, "billing") {
					err := p.write(tok)
					if !errors.Is(err, fence.ErrInvalid) {
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
