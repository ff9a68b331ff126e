package pgxguard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/signing"
)

// TestVerifierKeepsMark: with guard.WithVerifier, Update and Send accept a
// token the key signed, and no unsigned, inflated, forged or foreign token
// moves the mark or writes anything.
func TestVerifierKeepsMark(t *testing.T) {
	pool, table := newPool(t, "_log")
	mustExec(t, pool, "CREATE TABLE "+table+"_log (token BIGINT NOT NULL)")
	key := signing.NewKey(time.Now())
	s := newStore(t, pool, table, quiet, guard.WithVerifier(signing.NewKeySet(key.Public())))
	writes := map[string]func(tok fence.Token) error{
		"Update": func(tok fence.Token) error {
			return s.Update(ctx, "orders", guard.Write{Token: tok}, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+table+"_log VALUES ($1)", int64(tok.Value))
				return err
			})
		},
		"Send": func(tok fence.Token) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO "+table+"_log VALUES ($1)", int64(tok.Value))
			return s.Send(ctx, "orders", guard.Write{Token: tok}, b)
		},
	}
	state := func() (mark uint64, rows int) {
		t.Helper()
		m, err := s.Highest(ctx, "orders")
		if err == nil {
			err = pool.QueryRow(ctx, "SELECT count(*) FROM "+table+"_log").Scan(&rows)
		}
		if err != nil {
			t.Fatal(err)
		}
		return m.Token, rows
	}
	genuine := key.Sign(fence.Token{Scope: "orders", Value: 5})
	for how, write := range writes {
		if err := write(genuine); err != nil {
			t.Fatalf("%s of the genuine token: %v", how, err)
		}
		_, before := state()
		for name, tok := range guardtest.Forgeries(key, genuine, "billing") {
			if err := write(tok); !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("%s of the %s token: %v, want an invalid-token error", how, name, err)
			}
			if m, rows := state(); m != 5 || rows != before {
				t.Fatalf("after %s of the %s token: mark %d, %d rows; want 5, %d", how, name, m, rows, before)
			}
		}
	}
}
