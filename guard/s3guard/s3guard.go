package s3guard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// Option configures a Guard or a Store.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	prefix string
	strict bool
	log    *slog.Logger
	obs    guard.Observer
	verify guard.Verifier
}

// WithVerifier makes a Guard accept only tokens v verifies (see
// guard.WithVerifier); a refused token never reaches the bucket.
func WithVerifier(v guard.Verifier) Option { return optionFunc(func(c *config) { c.verify = v }) }

// WithStrictSequence makes a Guard refuse, inside one epoch, a write whose
// sequence number is not greater than the last accepted one (guard.Check's
// strict rule). A Store ignores it: guard.Guard passes strict to Fence.
func WithStrictSequence() Option { return optionFunc(func(c *config) { c.strict = true }) }

// WithLogger logs every stale rejection of a Guard to l (default
// slog.Default()) with the fields scope, presented_token, highest_token,
// presented_seq and highest_seq.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.log = l }) }

// WithObserver reports every accepted and rejected write of a Guard to o,
// as guard.WithObserver does (guardmetrics has a Prometheus one).
func WithObserver(o guard.Observer) Option { return optionFunc(func(c *config) { c.obs = o }) }

// WithPrefix replaces DefaultPrefix: the marks go under prefix+"marks/",
// the data under prefix+"data/". Every writer of a scope, and its readers
// and follower, must use the same prefix: under another one a scope has
// another mark.
func WithPrefix(p string) Option { return optionFunc(func(c *config) { c.prefix = p }) }

func newConfig(opts []Option) config {
	c := config{prefix: DefaultPrefix, log: slog.Default()}
	for _, o := range opts {
		o.apply(&c)
	}
	return c
}

// Guard writes and reads a bucket's objects through their scope's mark
// object: a write's data goes to a new key of its own, and the write
// commits by swapping the mark (If-Match on its ETag) for one that names
// that key, so a write either lands whole, with a token the mark's rule
// accepts, or is invisible. It is safe for concurrent use, by any number
// of processes sharing the bucket.
type Guard struct {
	m   *marks
	log *slog.Logger
	// opts configure the guard.Guard that checks each write's token
	// (scope, value, signature), logs and counts refusals, as every
	// guard's does.
	opts []guard.Option
}

// New returns a Guard over bucket, through api.
func New(api *s3.Client, bucket string, opts ...Option) *Guard {
	cfg := newConfig(opts)
	g := &Guard{m: newMarks(api, bucket, cfg.prefix), log: cfg.log, opts: []guard.Option{guard.WithLogger(cfg.log)}}
	if cfg.strict {
		g.opts = append(g.opts, guard.WithStrictSequence())
	}
	if cfg.obs != nil {
		g.opts = append(g.opts, guard.WithObserver(cfg.obs))
	}
	if cfg.verify != nil {
		g.opts = append(g.opts, guard.WithVerifier(cfg.verify))
	}
	return g
}

// MarkKey returns the key of scope's mark object: the prefix, "marks/",
// then the scope with every byte other than ASCII letters, digits, '-'
// and '_' written as %XX ("orders/eu" → "fence/marks/orders%2Feu").
func (g *Guard) MarkKey(scope string) string { return g.m.markKey(scope) }

// Highest returns the highest mark accepted for scope (zero if none).
func (g *Guard) Highest(ctx context.Context, scope string) (guard.Mark, error) {
	return g.m.highest(ctx, scope)
}

// Put writes body as the object name of w's scope: one PutObject of the
// data to a new key, then the swap of the mark that names it. name is any
// non-empty UTF-8 string of at most 1024 bytes; it is a name in the
// mark, not a key in the bucket. A stale w returns a *guard.StaleError
// (errors.Is fence.ErrStale) and leaves the bucket as it was.
func (g *Guard) Put(ctx context.Context, w guard.Write, name string, body []byte) error {
	key := g.m.newKey(w)
	put := func(ctx context.Context) error {
		_, err := g.m.api.PutObject(ctx, &s3.PutObjectInput{Bucket: &g.m.bucket, Key: &key, Body: bytes.NewReader(body)})
		if err != nil {
			return fmt.Errorf("write the data to s3://%s/%s: %w", g.m.bucket, key, err)
		}
		return nil
	}
	return g.write(ctx, w, "put", name, key, put)
}

// NewKey returns a key, under w's scope's data prefix, that no other write
// uses, for data too large for Put: upload it there by any means (a
// multipart upload, a copy), then Commit it. Until the commit no reader
// sees it. It is safe for concurrent use.
func (g *Guard) NewKey(w guard.Write) string { return g.m.newKey(w) }

// Commit makes the object at key, uploaded to a key from NewKey, the
// object name of w's scope, as Put does with the data it writes. A key
// outside the scope's data prefix, or already named in its mark, is
// refused (fence.ErrInvalid), and one that does not exist is an error.
// A stale w returns a *guard.StaleError; the data at key is then deleted.
func (g *Guard) Commit(ctx context.Context, w guard.Write, name, key string) error {
	if dir := g.m.dataDir(w.Token.Scope); !strings.HasPrefix(key, dir) || strings.Contains(key[len(dir):], "/") {
		return &fence.InvalidError{Field: "key", Reason: fmt.Sprintf("%q is not a key of scope %q; want one from NewKey, under %q", key, w.Token.Scope, dir)}
	}
	head := func(ctx context.Context) error {
		_, err := g.m.api.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &g.m.bucket, Key: &key})
		if err != nil {
			return fmt.Errorf("commit s3://%s/%s: %w", g.m.bucket, key, err)
		}
		return nil
	}
	return g.write(ctx, w, "commit", name, key, head)
}

// Delete removes the object name from w's scope. The mark stays, with w's
// token: a stale writer can no more bring the object back than overwrite
// it. Deleting a name the scope does not hold is no error.
func (g *Guard) Delete(ctx context.Context, w guard.Write, name string) error {
	return g.write(ctx, w, "delete", name, "", nil)
}

// write commits name → key (key "" deletes name) after stage, and deletes
// the data no mark names any more: the version it replaced, or its own
// when it is refused. A guard.Guard over the write's own store checks the
// token first, and logs and counts a refusal.
func (g *Guard) write(ctx context.Context, w guard.Write, op, name, key string, stage func(context.Context) error) error {
	if w.Token.Scope == "" {
		return &fence.InvalidError{Field: "scope", Reason: "the write's token has no scope"}
	}
	if name == "" || len(name) > 1024 || !utf8.ValidString(name) {
		return &fence.InvalidError{Field: "name", Reason: fmt.Sprintf("%q: want 1 to 1024 bytes of UTF-8", name)}
	}
	if stage == nil {
		stage = func(context.Context) error { return nil }
	}
	scope := w.Token.Scope
	o := &oneWrite{m: g.m, name: name, key: key}
	err := guard.New(o, g.opts...).Fence(ctx, scope, w, stage)
	if err == nil {
		if prev := o.replaced[name]; prev != "" && prev != key {
			g.removeData(ctx, scope, prev)
		}
		return nil
	}
	if stale, ok := errors.AsType[*guard.StaleError](err); ok {
		// A put's data exists once staged; a commit's was uploaded before.
		if key != "" && (o.staged || op == "commit") {
			g.removeData(ctx, scope, key)
		}
		return stale
	}
	if errors.Is(err, fence.ErrInvalid) && !o.staged {
		return err // refused before any request
	}
	return fmt.Errorf("fenced %s of %q in %q: %w", op, name, scope, err)
}

// oneWrite is the guard.Store of one write: its Fence commits the write's
// change of the mark's objects.
type oneWrite struct {
	m         *marks
	name, key string
	staged    bool              // Fence called apply
	replaced  map[string]string // the objects the committed mark replaced
}

func (o *oneWrite) Fence(ctx context.Context, w guard.Write, strict bool, apply func(context.Context) error) error {
	stage := func(ctx context.Context) error {
		o.staged = true
		return apply(ctx)
	}
	var err error
	o.replaced, err = o.m.commit(ctx, w, strict, stage, o.edit)
	return err
}

func (o *oneWrite) edit(objects map[string]string) error {
	if o.key == "" {
		delete(objects, o.name)
		return nil
	}
	for n, k := range objects {
		if k == o.key && n != o.name {
			return &fence.InvalidError{Field: "key", Reason: fmt.Sprintf("%q is already the object %q of its scope", o.key, n)}
		}
	}
	objects[o.name] = o.key
	return nil
}

// removeData deletes data no mark names any more. It is tidiness, not
// safety, so a failure is only logged: the object is unreachable anyway.
// It never deletes outside the scope's data prefix, whatever a mark says.
func (g *Guard) removeData(ctx context.Context, scope, key string) {
	if !strings.HasPrefix(key, g.m.dataDir(scope)) {
		return
	}
	_, err := g.m.api.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &g.m.bucket, Key: &key})
	if err != nil {
		g.log.LogAttrs(ctx, slog.LevelWarn, "could not delete unreachable data",
			slog.String("scope", scope), slog.String("key", key), slog.String("err", err.Error()))
	}
}

// Get returns the object name of scope, as the scope's mark names it now;
// an error wrapping fs.ErrNotExist if the mark names no such object.
func (g *Guard) Get(ctx context.Context, scope, name string) ([]byte, error) {
	for range maxReadTries {
		f, _, err := g.m.read(ctx, scope)
		if err != nil {
			return nil, err
		}
		key, ok := f.Objects[name]
		if !ok {
			return nil, fmt.Errorf("scope %q has no object %q: %w", scope, name, fs.ErrNotExist)
		}
		out, err := g.m.api.GetObject(ctx, &s3.GetObjectInput{Bucket: &g.m.bucket, Key: &key})
		if status(err) == http.StatusNotFound {
			continue // replaced, and its old data deleted, since the mark was read
		}
		if err != nil {
			return nil, fmt.Errorf("read %q of %q (s3://%s/%s): %w", name, scope, g.m.bucket, key, err)
		}
		data, err := io.ReadAll(out.Body)
		out.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("read %q of %q (s3://%s/%s): %w", name, scope, g.m.bucket, key, err)
		}
		return data, nil
	}
	return nil, fmt.Errorf("read %q of %q: its data was replaced under each of %d reads", name, scope, maxReadTries)
}

// Names returns the names of scope's objects, sorted.
func (g *Guard) Names(ctx context.Context, scope string) ([]string, error) {
	f, _, err := g.m.read(ctx, scope)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(f.Objects))
	for n := range f.Objects {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// ErrSuperseded reports that Store.Fence applied a write and then found
// that another process had advanced the scope's mark past it meanwhile. It
// wraps fence.ErrStale; the error returned also carries the
// *guard.StaleError.
var ErrSuperseded = fmt.Errorf("%w: superseded while applying", fence.ErrStale)

// Store is a guard.Store and a guard.Lister whose marks are a bucket's
// mark objects, the ones a Guard with the same prefix keeps: for a
// follower (guard/follow), and for a guard.Guard whose writes go
// elsewhere. It is safe for concurrent use.
//
// Fence reads the mark, checks it, calls apply, then swaps the mark
// conditional on the version it read. Fence calls for one scope on one
// Store are serialized by a lock in this process; across processes only
// the swap orders them, and it cannot undo an apply: if another process
// advances the mark past the write while apply runs, Fence reports it
// afterwards (an error wrapping ErrSuperseded and the *guard.StaleError,
// returned after apply ran). So give a Store's Fence only applies that do
// nothing (a follower's) or whose effects nobody sees until the mark
// names them; write data with Guard.
type Store struct {
	m *marks
}

// NewStore returns a Store over bucket, through api. Only WithPrefix
// applies; strictness, logging and observers belong to the guard.Guard.
func NewStore(api *s3.Client, bucket string, opts ...Option) *Store {
	return &Store{m: newMarks(api, bucket, newConfig(opts).prefix)}
}

// Fence implements guard.Store. The mark keeps the objects a Guard named.
func (s *Store) Fence(ctx context.Context, w guard.Write, strict bool, apply func(ctx context.Context) error) error {
	_, err := s.m.commit(ctx, w, strict, apply, nil)
	if sup, ok := errors.AsType[*errSuperseded](err); ok {
		return fmt.Errorf("%w: %w", ErrSuperseded, sup.stale)
	}
	return err
}

// Scopes implements guard.Lister: the scopes starting with prefix that
// have a mark object.
func (s *Store) Scopes(ctx context.Context, prefix string) ([]string, error) {
	sc, err := s.m.scopes(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("s3guard: %w", err)
	}
	return sc, nil
}

// Highest returns the highest mark recorded for scope (zero if none).
func (s *Store) Highest(ctx context.Context, scope string) (guard.Mark, error) {
	return s.m.highest(ctx, scope)
}
