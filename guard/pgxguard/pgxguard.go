package pgxguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// DB is where a Store sends its statements: a *pgxpool.Pool or a
// *pgx.Conn. Not a pgx.Tx: a Store begins and ends its own transactions.
type DB interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Store keeps each scope's highest accepted mark in a fence table of the
// database it guards, the table of sqlguard's Postgres dialect, and
// advances it in the transaction that makes the guarded writes. It is a
// guard.Store, safe for concurrent use by any number of processes sharing
// the database, and fences the same scopes as a sqlguard.Store on the
// same table.
type Store struct {
	db      DB
	table   string
	create  string
	advance [2]string // non-strict and strict
	gopts   []guard.Option
	guard   *guard.Guard // over the Store itself: Update's checks, logs and observer
}

// New returns a Store over db that keeps its marks in table
// (sqlguard.DefaultTable if empty; the naming rules of sqlguard.WithTable
// apply). The options are those of a guard.Guard (strictness, logger,
// observer, verifier) and apply to Update and Send. New touches no table:
// call CreateTable once before the first write.
func New(db DB, table string, opts ...guard.Option) (*Store, error) {
	if _, ok := db.(pgx.Tx); ok {
		return nil, errors.New("pgxguard: db is a pgx.Tx; give a *pgxpool.Pool or a *pgx.Conn: a Store begins and commits its own transactions")
	}
	if table == "" {
		table = sqlguard.DefaultTable
	}
	create, err := sqlguard.Postgres.CreateTableSQL(table)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, table: table, create: create, gopts: opts}
	s.advance = [2]string{advance(table, ">="), advance(table, ">")}
	s.guard = guard.New(s, opts...)
	return s, nil
}

// advance is the fence statement: an upsert of the scope's row that
// records guard.Next for a current write and, for a stale one, sets the
// token to NULL, which the column's NOT NULL constraint refuses. The
// error aborts the transaction, and with it whatever was sent after the
// statement: that is what lets Send pipeline the caller's writes behind
// it. Resolving the conflict locks the row until the transaction ends,
// as sqlguard's statement does, so the decision holds until the commit.
func advance(table, after string) string {
	return strings.NewReplacer("TABLE", table, "AFTER", after).Replace(
		`INSERT INTO TABLE AS f (scope, token, seq) VALUES ($1, $2, $3)
ON CONFLICT (scope) DO UPDATE SET
	token = CASE WHEN excluded.token > f.token OR excluded.token = f.token AND (excluded.seq = 0 OR excluded.seq AFTER f.seq)
		THEN excluded.token END,
	seq = CASE WHEN excluded.token > f.token THEN excluded.seq ELSE GREATEST(f.seq, excluded.seq) END`)
}

// Table returns the name of the fence table.
func (s *Store) Table() string { return s.table }

// CreateTable creates the fence table if it does not exist. Running it
// again, or from several processes at once, is harmless.
func (s *Store) CreateTable(ctx context.Context) error {
	_, err := s.db.Exec(ctx, s.create)
	if err != nil {
		// Two sessions creating the same table at once can both miss it,
		// and one then fails on the catalog's unique index; by now the
		// table exists, and IF NOT EXISTS sees it.
		_, err = s.db.Exec(ctx, s.create)
	}
	if err != nil {
		return fmt.Errorf("pgxguard: create table %s: %w", s.table, err)
	}
	return nil
}

// Update checks w against its scope's mark and advances the mark, in the
// round trip that begins the transaction, then runs fn in the transaction
// and commits. A stale w returns a *guard.StaleError (errors.Is
// fence.ErrStale) and fn does not run; if fn fails, or the commit does,
// the transaction rolls back with the mark, and Update returns that
// error. fn must not commit or roll back tx. scope is the scope fn
// writes: a token of another scope is refused (guard.ErrWrongScope).
func (s *Store) Update(ctx context.Context, scope string, w guard.Write, fn func(tx pgx.Tx) error) error {
	return s.guard.Fence(ctx, scope, w, func(ctx context.Context) error {
		tx, _ := TxFromContext(ctx)
		return fn(tx)
	})
}

// Send sends the fence statement and the statements queued in b in one
// round trip, as one implicit transaction: if w is stale, none of b's
// statements takes effect and Send returns a *guard.StaleError; otherwise
// they all commit, with the mark, or none does. b's callbacks
// (QueuedQuery.Exec, Query, QueryRow) run as pgx.BatchResults.Close runs
// them, only once the write was accepted. b must not control transactions
// (no BEGIN, COMMIT or Batch.BeginTx) and must not be sent again.
//
// Send is Update for writes that need no answer before the next
// statement: it costs the same round trips as sending b alone.
func (s *Store) Send(ctx context.Context, scope string, w guard.Write, b *pgx.Batch) error {
	return guard.New(batchWrite{s, b}, s.gopts...).Fence(ctx, scope, w, func(context.Context) error { return nil })
}

// batchWrite is the guard.Store of one Send, so that guard.Guard checks
// the scope and the token's range, and logs and observes, as it does for
// Update.
type batchWrite struct {
	s *Store
	b *pgx.Batch
}

func (bw batchWrite) Fence(ctx context.Context, w guard.Write, strict bool, apply func(context.Context) error) error {
	if err := sqlguard.CheckWrite(w); err != nil {
		return err
	}
	b := &pgx.Batch{}
	accepted := bw.s.queueAdvance(b, w, strict)
	b.QueuedQueries = append(b.QueuedQueries, bw.b.QueuedQueries...)
	err := bw.s.db.SendBatch(ctx, b).Close()
	if err := bw.s.refused(ctx, w, strict, *accepted, err); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("pgxguard: fenced batch on %q: %w", w.Token.Scope, err)
	}
	return apply(ctx)
}

// Fence implements guard.Store: it begins a transaction and runs the fence
// statement in one round trip, then runs apply in the transaction, which
// apply finds with TxFromContext, and commits.
func (s *Store) Fence(ctx context.Context, w guard.Write, strict bool, apply func(ctx context.Context) error) error {
	if err := sqlguard.CheckWrite(w); err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	accepted := s.queueAdvance(b, w, strict)
	br := s.db.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit, a no-op
	err := br.Close()
	if err != nil {
		// Roll back now: the mark is read outside the aborted transaction.
		tx.Rollback(context.WithoutCancel(ctx))
	}
	if err := s.refused(ctx, w, strict, *accepted, err); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("pgxguard: begin and advance the mark of %q: %w", w.Token.Scope, err)
	}
	if err := apply(context.WithValue(ctx, txKey{}, tx)); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgxguard: commit the write of %q: %w", w.Token.Scope, err)
	}
	return nil
}

// queueAdvance queues the fence statement for w, and returns where its
// callback records that it ran, which it does only if the statement
// accepted w.
func (s *Store) queueAdvance(b *pgx.Batch, w guard.Write, strict bool) *bool {
	var accepted bool
	i := 0
	if strict {
		i = 1
	}
	b.Queue(s.advance[i], w.Token.Scope, int64(w.Token.Value), int64(w.Seq)).Exec(func(pgconn.CommandTag) error {
		accepted = true
		return nil
	})
	return &accepted
}

// refused returns the error for a write the fence statement refused: a
// *guard.StaleError if it failed on the NOT NULL of the token column.
// It returns nil if the statement accepted w, or failed for another
// reason, which err then reports.
func (s *Store) refused(ctx context.Context, w guard.Write, strict, accepted bool, err error) error {
	var pe *pgconn.PgError
	if accepted || !errors.As(err, &pe) || pe.Code != "23502" || pe.ColumnName != "token" {
		return nil
	}
	m, err := s.Highest(ctx, w.Token.Scope)
	if err != nil {
		return err
	}
	if err := guard.Check(w.Token.Scope, m, w, strict); err != nil {
		return err
	}
	// The mark only grows, so a mark read after the refusal refuses too;
	// if it does not, refuse rather than report an acceptance.
	return fmt.Errorf("pgxguard: %s refused token %d sequence %d of %q, but its mark %+v admits it", s.table, w.Token.Value, w.Seq, w.Token.Scope, m)
}

// Scopes implements guard.Lister: the scopes starting with prefix that
// have a mark.
func (s *Store) Scopes(ctx context.Context, prefix string) ([]string, error) {
	var scopes []string
	err := s.db.QueryRow(ctx, "SELECT coalesce(array_agg(scope), '{}') FROM "+s.table+" WHERE substr(scope, 1, $1) = $2",
		utf8.RuneCountInString(prefix), prefix).Scan(&scopes)
	if err != nil {
		return nil, fmt.Errorf("pgxguard: list the scopes of %s: %w", s.table, err)
	}
	return scopes, nil
}

// Highest returns the highest mark accepted for scope (zero if none).
func (s *Store) Highest(ctx context.Context, scope string) (guard.Mark, error) {
	var t, n int64
	err := s.db.QueryRow(ctx, "SELECT token, seq FROM "+s.table+" WHERE scope = $1", scope).Scan(&t, &n)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return guard.Mark{}, nil
	case err != nil:
		return guard.Mark{}, fmt.Errorf("pgxguard: read the mark of %q: %w", scope, err)
	}
	return guard.Mark{Token: uint64(t), Seq: uint64(n)}, nil
}

type txKey struct{}

// TxFromContext returns the transaction of the Fence call whose apply
// received ctx: writes made in it commit, or roll back, together with the
// fencing mark.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}
