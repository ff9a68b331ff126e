package sqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// ErrNoRow reports that UpdateRow found no row with the given key: nothing
// was written, and the token was neither accepted nor refused.
var ErrNoRow = errors.New("sqlguard: no such row")

// Row names one row of a table that carries its own fencing token: the
// row whose Key column equals ID. Table and Key must be plain SQL names
// (see WithTable); ID is sent as a bound parameter.
type Row struct {
	Table string
	Key   string
	ID    any
}

// UpdateRow sets the columns of set in one row, inside tx, if w is current
// for that row: the row's token column (WithTokenColumn) must be at most
// w's token, and becomes it. Such a row needs no fence table: its token
// travels with it.
//
// scope is the scope whose tokens fence the row; a token of another scope
// is refused with guard.ErrWrongScope, as guard.Guard.Fence does. A row
// whose token is greater returns a *guard.StaleError with Highest set to
// it; a missing row returns ErrNoRow. Either way nothing was written, but
// the caller should roll tx back if it made other writes that depend on
// this one. The Store's logger and observer see the outcome.
//
// Column names in set must be plain SQL names, and not the token column;
// their values are bound parameters. A row carries a token, not a
// sequence, so w.Seq must be 0. The key should be unique: if it matches
// several rows, UpdateRow updates them all and returns an error, so that
// the caller rolls back.
func (s *Store) UpdateRow(ctx context.Context, tx *sql.Tx, scope string, w guard.Write, row Row, set map[string]any) error {
	rw := rowWrite{s: s, tx: tx, row: row, set: set}
	return guard.New(rw, s.gopts...).Fence(ctx, scope, w, func(context.Context) error { return nil })
}

// rowWrite is the guard.Store of one UpdateRow call, so that guard.Guard
// checks the scope and the token's range, and logs and observes, as it
// does for every other store. Its Fence is the row's conditional UPDATE.
type rowWrite struct {
	s   *Store
	tx  *sql.Tx
	row Row
	set map[string]any
}

func (r rowWrite) Fence(ctx context.Context, w guard.Write, _ bool, apply func(context.Context) error) error {
	if w.Seq != 0 {
		return &fence.InvalidError{Field: "sequence", Reason: "a fenced row keeps a token only; write it with sequence 0"}
	}
	update, args, err := r.s.rowUpdate(r.row, r.set, int64(w.Token.Value))
	if err != nil {
		return err
	}
	done, err := r.exec(ctx, update, args)
	if err != nil || done {
		return err
	}
	// No row matched: the row is missing, or its token is greater, or (on
	// MySQL) the update matched but changed nothing, which MySQL counts as
	// no row. Lock the row to tell which; then its token cannot move
	// until tx ends.
	var have int64
	err = r.tx.QueryRowContext(ctx,
		"SELECT "+r.s.column+" FROM "+r.row.Table+" WHERE "+r.row.Key+" = "+r.s.dialect.param(1)+r.s.dialect.forUpdate(),
		r.row.ID).Scan(&have)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: %s where %s = %v", ErrNoRow, r.row.Table, r.row.Key, r.row.ID)
	case err != nil:
		return fmt.Errorf("sqlguard: read the token of %s %v: %w", r.row.Table, r.row.ID, err)
	case uint64(have) > w.Token.Value:
		return &guard.StaleError{Scope: w.Token.Scope, Presented: w.Token.Value, Highest: uint64(have)}
	}
	// The row admits the token. It may have been inserted after the
	// update's snapshot (PostgreSQL, or MySQL at READ COMMITTED), so write
	// again now that it is locked; a second zero is MySQL's "unchanged".
	if _, err := r.exec(ctx, update, args); err != nil {
		return err
	}
	return apply(ctx)
}

// exec runs the update and reports whether it changed the row.
func (r rowWrite) exec(ctx context.Context, update string, args []any) (bool, error) {
	res, err := r.tx.ExecContext(ctx, update, args...)
	if err != nil {
		return false, fmt.Errorf("sqlguard: fenced update of %s %v: %w", r.row.Table, r.row.ID, err)
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return false, fmt.Errorf("sqlguard: fenced update of %s %v: %w", r.row.Table, r.row.ID, err)
	case n > 1:
		return false, fmt.Errorf("sqlguard: fenced update of %s where %s = %v changed %d rows; the key must be unique", r.row.Table, r.row.Key, r.row.ID, n)
	}
	return n == 1, nil
}

// rowUpdate builds UPDATE table SET c = ?, ..., token = ? WHERE key = ?
// AND token <= ?, with every name checked and every value bound. The
// columns are sorted, so the same columns give the same text, which
// drivers cache as one prepared statement.
func (s *Store) rowUpdate(row Row, set map[string]any, token int64) (string, []any, error) {
	if err := checkName("table", row.Table, true); err != nil {
		return "", nil, err
	}
	if err := checkName("key column", row.Key, false); err != nil {
		return "", nil, err
	}
	cols := make([]string, 0, len(set))
	for c := range set {
		if err := checkName("column", c, false); err != nil {
			return "", nil, err
		}
		if strings.EqualFold(c, s.column) {
			return "", nil, &fence.InvalidError{Field: "column", Reason: fmt.Sprintf("%s is the token column; UpdateRow sets it", c)}
		}
		cols = append(cols, c)
	}
	slices.Sort(cols)
	var b strings.Builder
	args := make([]any, 0, len(cols)+3)
	next := func(v any) string {
		args = append(args, v)
		return s.dialect.param(len(args))
	}
	b.WriteString("UPDATE " + row.Table + " SET ")
	for _, c := range cols {
		b.WriteString(c + " = " + next(set[c]) + ", ")
	}
	b.WriteString(s.column + " = " + next(token))
	b.WriteString(" WHERE " + row.Key + " = " + next(row.ID))
	b.WriteString(" AND " + s.column + " <= " + next(token))
	return b.String(), args, nil
}
