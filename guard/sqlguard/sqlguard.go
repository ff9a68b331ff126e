package sqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"unicode/utf8"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// DefaultTable is the fence table's name unless WithTable gives another.
const DefaultTable = "fence_tokens"

// DefaultTokenColumn is the column of a row-fenced table that holds the
// token of the row's last write, unless WithTokenColumn gives another.
const DefaultTokenColumn = "fence_token"

// Option configures a Store.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	table  string
	column string
	strict bool
	log    *slog.Logger
	obs    guard.Observer
	verify guard.Verifier
}

// WithTable keeps the marks in table instead of DefaultTable: a name of
// ASCII letters, digits and underscores, optionally qualified by a schema
// ("fencing.tokens"). It is used unquoted, so the database folds its case
// as it does for names in the caller's own SQL.
func WithTable(table string) Option { return optionFunc(func(c *config) { c.table = table }) }

// WithTokenColumn names the column that UpdateRow compares and sets
// (default DefaultTokenColumn). The rules of WithTable apply, without a
// qualifier.
func WithTokenColumn(column string) Option {
	return optionFunc(func(c *config) { c.column = column })
}

// WithStrictSequence makes Update refuse, inside one epoch, a write whose
// sequence number is not greater than the last accepted one (guard.Check's
// strict rule). Fence takes strictness from the guard.Guard that calls it.
func WithStrictSequence() Option { return optionFunc(func(c *config) { c.strict = true }) }

// WithLogger logs every stale rejection of Update and UpdateRow to l
// (default slog.Default()), as guard.WithLogger does.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.log = l }) }

// WithObserver reports every accepted and rejected write of Update and
// UpdateRow to o, as guard.WithObserver does.
func WithObserver(o guard.Observer) Option { return optionFunc(func(c *config) { c.obs = o }) }

// WithVerifier makes Update and UpdateRow accept only tokens v verifies
// (guard.WithVerifier), before the fence table or row is touched.
func WithVerifier(v guard.Verifier) Option { return optionFunc(func(c *config) { c.verify = v }) }

// Store keeps each scope's highest accepted mark in a table of the
// database it guards, and advances it inside the transaction that makes
// the guarded writes, so the two commit or roll back together. It is a
// guard.Store, and safe for concurrent use by any number of processes
// sharing the database.
type Store struct {
	db      *sql.DB
	dialect Dialect
	table   string
	column  string
	gopts   []guard.Option
	guard   *guard.Guard // over the Store itself: Update's checks, logs and observer

	mu    sync.Mutex
	stmts [2]*sql.Stmt // advance, non-strict and strict; prepared on first use
}

// New returns a Store over db, which must be of dialect d. It touches no
// table: call CreateTable once (it is idempotent) before the first write.
func New(db *sql.DB, d Dialect, opts ...Option) (*Store, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	c := config{table: DefaultTable, column: DefaultTokenColumn, log: slog.Default()}
	for _, o := range opts {
		o.apply(&c)
	}
	if err := checkName("table", c.table, true); err != nil {
		return nil, err
	}
	if err := checkName("token column", c.column, false); err != nil {
		return nil, err
	}
	s := &Store{db: db, dialect: d, table: c.table, column: c.column}
	s.gopts = []guard.Option{guard.WithLogger(c.log)}
	if c.strict {
		s.gopts = append(s.gopts, guard.WithStrictSequence())
	}
	if c.obs != nil {
		s.gopts = append(s.gopts, guard.WithObserver(c.obs))
	}
	if c.verify != nil {
		s.gopts = append(s.gopts, guard.WithVerifier(c.verify))
	}
	s.guard = guard.New(s, s.gopts...)
	return s, nil
}

// DB returns the database.
func (s *Store) DB() *sql.DB { return s.db }

// Table returns the name of the fence table.
func (s *Store) Table() string { return s.table }

// CreateTable creates the fence table if it does not exist. Running it
// again, or from several processes at once, is harmless.
func (s *Store) CreateTable(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, s.dialect.createTable(s.table))
	if err != nil {
		// Two PostgreSQL sessions creating the same table at once can both
		// miss it and one then fails on the catalog's unique index; by now
		// the table exists, and IF NOT EXISTS sees it.
		_, err = s.db.ExecContext(ctx, s.dialect.createTable(s.table))
	}
	if err != nil {
		return fmt.Errorf("sqlguard: create table %s: %w", s.table, err)
	}
	return nil
}

// Close releases the Store's prepared statements. It does not close the
// database.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for i, st := range s.stmts {
		if st != nil {
			errs = append(errs, st.Close())
			s.stmts[i] = nil
		}
	}
	return errors.Join(errs...)
}

// stmt returns the prepared advance statement. It is prepared on first use
// rather than in New because the table may not exist before CreateTable; a
// failed preparation is retried by the next call.
func (s *Store) stmt(ctx context.Context, strict bool) (*sql.Stmt, error) {
	i := 0
	if strict {
		i = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stmts[i] == nil {
		st, err := s.db.PrepareContext(ctx, s.dialect.advance(s.table, strict))
		if err != nil {
			return nil, fmt.Errorf("sqlguard: prepare the fence statement on %s: %w", s.table, err)
		}
		s.stmts[i] = st
	}
	return s.stmts[i], nil
}

// Update begins a transaction, checks w against its scope's mark and
// advances the mark, runs fn and commits. A stale w returns a
// *guard.StaleError (errors.Is fence.ErrStale) and fn does not run; if fn
// fails, or the commit does, the transaction rolls back with the mark, and
// Update returns that error. fn must not commit or roll back tx.
//
// scope is the scope fn writes: a token of another scope is refused
// (guard.ErrWrongScope), so a token granted for one resource cannot pass
// for another's. Update checks w as guard.Guard.Fence does, with the
// Store's strictness, logger, observer and verifier.
func (s *Store) Update(ctx context.Context, scope string, w guard.Write, fn func(tx *sql.Tx) error) error {
	return s.guard.Fence(ctx, scope, w, func(ctx context.Context) error {
		tx, _ := TxFromContext(ctx)
		return fn(tx)
	})
}

// Fence implements guard.Store: apply runs inside the transaction that
// advanced the mark, before it commits, and finds it with TxFromContext to
// make its writes there.
func (s *Store) Fence(ctx context.Context, w guard.Write, strict bool, apply func(ctx context.Context) error) error {
	if err := CheckWrite(w); err != nil {
		return err
	}
	st, err := s.stmt(ctx, strict)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlguard: begin: %w", err)
	}
	defer tx.Rollback() // after Commit, a no-op
	if err := s.advance(ctx, tx, st, w, strict); err != nil {
		return err
	}
	if err := apply(context.WithValue(ctx, txKey{}, tx)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlguard: commit the write of %q: %w", w.Token.Scope, err)
	}
	return nil
}

// advance runs the fence statement in tx. On a stale write it reads the
// mark that refused it, for the error.
func (s *Store) advance(ctx context.Context, tx *sql.Tx, st *sql.Stmt, w guard.Write, strict bool) error {
	scope := w.Token.Scope
	ok, err := s.dialect.accepted(ctx, tx.StmtContext(ctx, st), scope, int64(w.Token.Value), int64(w.Seq))
	if err != nil {
		return fmt.Errorf("sqlguard: advance the mark of %q: %w", scope, err)
	}
	if ok {
		return nil
	}
	m, err := s.highest(ctx, tx, scope)
	if err != nil {
		return err
	}
	if err := guard.Check(scope, m, w, strict); err != nil {
		return err
	}
	// Unreachable while the statement and guard.Check agree; refuse
	// rather than apply a write the database did not record.
	return fmt.Errorf("sqlguard: %s refused token %d sequence %d of %q, but its mark %+v admits it", s.table, w.Token.Value, w.Seq, scope, m)
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *Store) highest(ctx context.Context, q querier, scope string) (guard.Mark, error) {
	var t, n int64
	err := q.QueryRowContext(ctx, "SELECT token, seq FROM "+s.table+" WHERE scope = "+s.dialect.param(1), scope).Scan(&t, &n)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return guard.Mark{}, nil
	case err != nil:
		return guard.Mark{}, fmt.Errorf("sqlguard: read the mark of %q: %w", scope, err)
	}
	return guard.Mark{Token: uint64(t), Seq: uint64(n)}, nil
}

// Scopes implements guard.Lister: the scopes starting with prefix that
// have a mark.
func (s *Store) Scopes(ctx context.Context, prefix string) ([]string, error) {
	// substr counts characters of text, but bytes of MySQL's VARBINARY.
	n := utf8.RuneCountInString(prefix)
	if s.dialect == MySQL {
		n = len(prefix)
	}
	rows, err := s.db.QueryContext(ctx, "SELECT scope FROM "+s.table+" WHERE substr(scope, 1, "+s.dialect.param(1)+") = "+s.dialect.param(2), n, prefix)
	if err != nil {
		return nil, fmt.Errorf("sqlguard: list the scopes of %s: %w", s.table, err)
	}
	defer rows.Close()
	var scopes []string
	for rows.Next() {
		var scope string
		if err := rows.Scan(&scope); err != nil {
			return nil, fmt.Errorf("sqlguard: list the scopes of %s: %w", s.table, err)
		}
		scopes = append(scopes, scope)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlguard: list the scopes of %s: %w", s.table, err)
	}
	return scopes, nil
}

// Highest returns the highest mark accepted for scope (zero if none).
func (s *Store) Highest(ctx context.Context, scope string) (guard.Mark, error) {
	return s.highest(ctx, s.db, scope)
}

type txKey struct{}

// TxFromContext returns the transaction of the Fence call whose apply
// received ctx: writes made in it commit, or roll back, together with the
// fencing mark.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok
}

// CheckWrite refuses a write that a fence table's columns cannot hold:
// an empty or oversized scope, a token outside 1 to fence.MaxToken, or a
// sequence above 2^63-1. A guard.Guard has checked the token already, but
// a Store's Fence may be called without one.
func CheckWrite(w guard.Write) error {
	if w.Token.Scope == "" || len(w.Token.Scope) > fence.MaxScopeLen {
		return &fence.InvalidError{Field: "scope", Reason: fmt.Sprintf("%d bytes, want 1 to %d", len(w.Token.Scope), fence.MaxScopeLen)}
	}
	if w.Token.Value == 0 || w.Token.Value > fence.MaxToken {
		return &fence.InvalidError{Field: "token", Reason: fmt.Sprintf("value %d is outside 1 to %d", w.Token.Value, uint64(fence.MaxToken))}
	}
	if w.Seq > math.MaxInt64 {
		return &fence.InvalidError{Field: "sequence", Reason: fmt.Sprintf("%d does not fit the signed 64-bit column; sequences run to %d", w.Seq, int64(math.MaxInt64))}
	}
	return nil
}

// checkName admits SQL identifiers that need no quoting in any dialect,
// which is what keeps the names Store pastes into its statements from
// carrying SQL of their own. qualified allows one "schema." prefix.
func checkName(field, name string, qualified bool) error {
	part := func(p string) bool {
		if p == "" || len(p) > 63 || p[0] >= '0' && p[0] <= '9' {
			return false
		}
		for _, c := range []byte(p) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
				return false
			}
		}
		return true
	}
	ok := part(name)
	if !ok && qualified {
		for i := range len(name) {
			if name[i] == '.' {
				ok = part(name[:i]) && part(name[i+1:])
				break
			}
		}
	}
	if !ok {
		return &fence.InvalidError{Field: field, Reason: fmt.Sprintf("%q is not a plain SQL name: 1 to 63 ASCII letters, digits and underscores, not starting with a digit", name)}
	}
	return nil
}
