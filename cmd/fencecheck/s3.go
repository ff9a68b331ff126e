package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/s3guard"
	"github.com/fence-dev/fence/internal/history"
)

// The s3/ scopes live in an S3 bucket, fenced by s3guard. A bucket has
// no transaction to commit a register and its log in, so the log is the
// register: every request the resource applies (a read, a write, a
// follower's mark) is one object of its scope, named "log/" and its index
// (8 digits), holding its history.Event, whose Value is the register's
// value after it. Fenced, s3guard.Guard's Put writes each entry, so the
// mark's swap that accepts the request's token is also what adds its
// entry, and the scope's mark lists its whole log; the register's value is
// the last entry's. Unfenced (--no-fence), each entry is a plain PutObject
// to a key of its own under the run's prefix, and nothing checks a token.
//
// The resource takes a lock per scope around reading the log's end and
// adding the next entry, as a database's transaction would; fenced, the
// follower's marks take it too. Its requests to the bucket are real ones,
// through the SDK, to the server of --s3.

// logName is the name of entry i of a scope's log.
func logName(i uint64) string { return fmt.Sprintf("log/%08d", i) }

// logIndex is the index of a log entry's name, or 0 if it names none.
func logIndex(name string) uint64 {
	s, ok := strings.CutPrefix(name, "log/")
	if !ok {
		return 0
	}
	i, _ := strconv.ParseUint(s, 10, 64)
	return i
}

// s3Backend is the backend of the s3/ scopes.
type s3Backend struct {
	api    *s3.Client
	bucket string
	prefix string // the run's: s3guard's objects under prefix+"guard/", the unfenced log under prefix+"plain/"
	fenced bool
	g      map[bool]*s3guard.Guard // by strictness
	store  *s3guard.Store

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// s3Target parses http://KEY:SECRET@HOST:PORT/BUCKET into a client of
// that server, making its requests with hc, and the bucket.
func s3Target(raw string, hc *http.Client) (*s3.Client, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("--s3: %w", err)
	}
	secret, _ := u.User.Password()
	bucket := strings.Trim(u.Path, "/")
	if u.Host == "" || bucket == "" || u.User.Username() == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, "", fmt.Errorf("--s3 %q: want http://KEY:SECRET@HOST:PORT/BUCKET", u.Redacted())
	}
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(u.Scheme + "://" + u.Host),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(u.User.Username(), secret, ""),
		UsePathStyle: true, // a server on an address, not a bucket per host name
		HTTPClient:   hc,
	}), bucket, nil
}

func openS3(ctx context.Context, raw, prefix string, fenced bool) (*s3Backend, error) {
	api, bucket, err := s3Target(raw, http.DefaultClient)
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := api.HeadBucket(hctx, &s3.HeadBucketInput{Bucket: &bucket}); err != nil {
		if _, missing := errors.AsType[*types.NotFound](err); !missing {
			return nil, fmt.Errorf("s3: bucket %q: %w", bucket, err)
		}
		if _, err := api.CreateBucket(hctx, &s3.CreateBucketInput{Bucket: &bucket}); err != nil {
			return nil, fmt.Errorf("s3: create bucket %q: %w", bucket, err)
		}
	}
	// The outer guard.Guard logs refusals; the inner ones would say it twice.
	quiet := s3guard.WithLogger(slog.New(slog.DiscardHandler))
	gp := s3guard.WithPrefix(prefix + "guard/")
	return &s3Backend{
		api: api, bucket: bucket, prefix: prefix, fenced: fenced,
		g:     map[bool]*s3guard.Guard{false: s3guard.New(api, bucket, gp, quiet), true: s3guard.New(api, bucket, gp, quiet, s3guard.WithStrictSequence())},
		store: s3guard.NewStore(api, bucket, gp),
		locks: map[string]*sync.Mutex{},
	}, nil
}

// lock serializes the requests of one scope in this process.
func (b *s3Backend) lock(scope string) (unlock func()) {
	b.mu.Lock()
	l := b.locks[scope]
	if l == nil {
		l = &sync.Mutex{}
		b.locks[scope] = l
	}
	b.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// pending is the entry a fenced request adds, made by apply and written
// by Fence with the mark's swap.
type pending struct {
	last  uint64 // the log's last index
	value string // the register's value after it
	entry []byte
	index uint64
}

type pendingKey struct{}

// s3Fences is the guard store of the s3/ scopes: Fence reads the end of
// the scope's log, lets apply make the next entry, and writes it with
// s3guard's Guard, which refuses it, changing nothing, if the token is
// stale. An apply that adds no entry advances the mark alone.
type s3Fences struct{ b *s3Backend }

func (f s3Fences) Fence(ctx context.Context, w guard.Write, strict bool, apply func(context.Context) error) error {
	b := f.b
	if !b.fenced {
		return apply(ctx) // a follower's mark, logged like any request
	}
	scope := w.Token.Scope
	unlock := b.lock(scope)
	defer unlock()
	p := &pending{}
	var err error
	if p.last, p.value, err = b.end(ctx, scope); err != nil {
		return err
	}
	if err := apply(context.WithValue(ctx, pendingKey{}, p)); err != nil {
		return err
	}
	if p.entry == nil {
		return b.store.Fence(ctx, w, strict, nil)
	}
	return b.g[strict].Put(ctx, w, logName(p.index), p.entry)
}

// Scopes lists the scopes with a mark, for the follower.
func (f s3Fences) Scopes(ctx context.Context, prefix string) ([]string, error) {
	return f.b.store.Scopes(ctx, prefix)
}

func (b *s3Backend) fences() guard.Store { return s3Fences{b} }

func (b *s3Backend) apply(ctx context.Context, a application) (opResponse, error) {
	p, fenced := ctx.Value(pendingKey{}).(*pending)
	if !fenced {
		unlock := b.lock(a.scope)
		defer unlock()
		p = &pending{}
		var err error
		if p.last, p.value, err = b.plainEnd(ctx, a.scope); err != nil {
			return opResponse{}, err
		}
	}
	if a.kind == history.Write {
		p.value = a.value
	}
	p.index = p.last + 1
	var err error
	if p.entry, err = json.Marshal(logEvent(a, p.index, p.value)); err != nil {
		return opResponse{}, err
	}
	resp := opResponse{Index: p.index, Value: p.value}
	if fenced {
		return resp, nil // Fence writes it
	}
	key := b.plainDir(a.scope) + logName(p.index)
	_, err = b.api.PutObject(ctx, &s3.PutObjectInput{Bucket: &b.bucket, Key: &key, Body: bytes.NewReader(p.entry)})
	return resp, err
}

// end returns the last index of a fenced scope's log and the register's
// value after it, as the scope's mark names them.
func (b *s3Backend) end(ctx context.Context, scope string) (uint64, string, error) {
	names, err := b.g[false].Names(ctx, scope)
	if err != nil {
		return 0, "", err
	}
	var last uint64
	for _, n := range names {
		last = max(last, logIndex(n))
	}
	if last == 0 {
		return 0, "", nil
	}
	data, err := b.g[false].Get(ctx, scope, logName(last))
	if err != nil {
		return 0, "", err
	}
	var e history.Event
	if err := json.Unmarshal(data, &e); err != nil {
		return 0, "", fmt.Errorf("s3: entry %d of %s: %w", last, scope, err)
	}
	return last, e.Value, nil
}

// plainDir is where the unfenced log of scope goes.
func (b *s3Backend) plainDir(scope string) string {
	return b.prefix + "plain/" + url.PathEscape(scope) + "/"
}

// plainEnd is end for the unfenced log.
func (b *s3Backend) plainEnd(ctx context.Context, scope string) (uint64, string, error) {
	keys, err := b.list(ctx, b.plainDir(scope))
	if err != nil || len(keys) == 0 {
		return 0, "", err
	}
	last := slices.Max(keys) // the names' 8 digits sort as their numbers
	var e history.Event
	if err := b.getJSON(ctx, last, &e); err != nil {
		return 0, "", err
	}
	return e.Index, e.Value, nil
}

func (b *s3Backend) list(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	for p := s3.NewListObjectsV2Paginator(b.api, &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: &prefix}); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("s3: list %s: %w", prefix, err)
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys, nil
}

func (b *s3Backend) getJSON(ctx context.Context, key string, v any) error {
	out, err := b.api.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &key})
	if err != nil {
		return fmt.Errorf("s3: read %s: %w", key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	if err == nil {
		err = json.Unmarshal(data, v)
	}
	if err != nil {
		return fmt.Errorf("s3: read %s: %w", key, err)
	}
	return nil
}

func (b *s3Backend) value(ctx context.Context, scope string) (string, error) {
	end := b.end
	if !b.fenced {
		end = b.plainEnd
	}
	_, v, err := end(ctx, scope)
	return v, err
}

// log reads every scope's log back from the bucket: fenced, the entries
// each scope's mark names, and nothing else.
func (b *s3Backend) log(ctx context.Context) ([]history.Event, error) {
	var read []func(context.Context) (history.Event, error)
	if b.fenced {
		scopes, err := b.store.Scopes(ctx, "")
		if err != nil {
			return nil, err
		}
		for _, scope := range scopes {
			names, err := b.g[false].Names(ctx, scope)
			if err != nil {
				return nil, err
			}
			for _, n := range names {
				if logIndex(n) == 0 {
					continue
				}
				read = append(read, func(ctx context.Context) (history.Event, error) {
					var e history.Event
					data, err := b.g[false].Get(ctx, scope, n)
					if err == nil {
						err = json.Unmarshal(data, &e)
					}
					return e, err
				})
			}
		}
	} else {
		keys, err := b.list(ctx, b.prefix+"plain/")
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			read = append(read, func(ctx context.Context) (history.Event, error) {
				var e history.Event
				return e, b.getJSON(ctx, k, &e)
			})
		}
	}
	evs := make([]history.Event, len(read))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8) // a log of thousands of entries in seconds, not minutes
	for i, r := range read {
		g.Go(func() (err error) {
			evs[i], err = r(gctx)
			return err
		})
	}
	return evs, g.Wait()
}

func (b *s3Backend) close() error { return nil }

// deleteS3 removes a run's objects: everything under prefix.
func deleteS3(ctx context.Context, raw, prefix string) error {
	api, bucket, err := s3Target(raw, http.DefaultClient)
	if err != nil {
		return err
	}
	b := &s3Backend{api: api, bucket: bucket}
	keys, err := b.list(ctx, prefix)
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range keys {
		if _, err := api.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &k}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
