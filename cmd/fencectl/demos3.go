package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/s3guard"
)

// s3Register keeps the demo's values in a bucket (--store
// s3://BUCKET[/PREFIX]), under a prefix of each story's own. Guarded, a
// scope's value is the object "value" its mark names, written by
// s3guard's Guard, so the swap of the mark that accepts the token is what
// sets it; unguarded, a plain PutObject of a key of its own.
type s3Register struct {
	api    *s3.Client
	bucket string
	prefix string
	g      map[bool]*s3guard.Guard // by strictness
	st     *s3guard.Store
}

// openS3Register returns the opener of a bucket's registers.
func openS3Register(t *guardTarget) func(dir string) (registerStore, error) {
	return func(string) (registerStore, error) {
		api, err := s3FromEnv()
		if err != nil {
			return nil, err
		}
		bucket := t.url.Host
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := api.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}); err != nil {
			return nil, fmt.Errorf("cannot reach bucket %q: %w", bucket, err)
		}
		// A prefix per story: each starts from an empty register, as the
		// other stores' fresh files do.
		prefix := fmt.Sprintf("%sdemo-%d/", s3Prefix(t.url), time.Now().UnixNano())
		gp := s3guard.WithPrefix(prefix)
		// The register's guard.Guard logs, or rather does not log, refusals.
		quiet := s3guard.WithLogger(slog.New(slog.DiscardHandler))
		return &s3Register{
			api: api, bucket: bucket, prefix: prefix,
			g:  map[bool]*s3guard.Guard{false: s3guard.New(api, bucket, gp, quiet), true: s3guard.New(api, bucket, gp, quiet, s3guard.WithStrictSequence())},
			st: s3guard.NewStore(api, bucket, gp),
		}, nil
	}
}

// s3Value is the context key under which a guarded put's value goes from
// the handler to Fence.
type s3Value struct{}

// Fence lets apply set the value, then writes it through the Guard, which
// refuses a stale token and changes nothing; an apply that sets nothing
// (a follower's) advances the mark alone.
func (r *s3Register) Fence(ctx context.Context, w guard.Write, strict bool, apply func(context.Context) error) error {
	var v *string
	if err := apply(context.WithValue(ctx, s3Value{}, &v)); err != nil {
		return err
	}
	if v == nil {
		return r.st.Fence(ctx, w, strict, nil)
	}
	return r.g[strict].Put(ctx, w, "value", []byte(*v))
}

// Scopes lists the marked scopes, for a follower.
func (r *s3Register) Scopes(ctx context.Context, prefix string) ([]string, error) {
	return r.st.Scopes(ctx, prefix)
}

func (r *s3Register) plainKey(scope string) string {
	return r.prefix + "plain/" + url.PathEscape(scope)
}

func (r *s3Register) put(ctx context.Context, scope, value string) error {
	if slot, ok := ctx.Value(s3Value{}).(**string); ok {
		*slot = &value // Fence writes it
		return nil
	}
	key := r.plainKey(scope)
	_, err := r.api.PutObject(ctx, &s3.PutObjectInput{Bucket: &r.bucket, Key: &key, Body: bytes.NewReader([]byte(value))})
	return err
}

// get reads the value the scope's mark names or, if it names none, the
// unguarded one.
func (r *s3Register) get(scope string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data, err := r.g[false].Get(ctx, scope, "value")
	if errors.Is(err, fs.ErrNotExist) {
		key := r.plainKey(scope)
		out, gerr := r.api.GetObject(ctx, &s3.GetObjectInput{Bucket: &r.bucket, Key: &key})
		if gerr != nil {
			return ""
		}
		defer out.Body.Close()
		data, err = io.ReadAll(out.Body)
	}
	if err != nil {
		return ""
	}
	return string(data)
}

func (r *s3Register) mark(scope string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, _ := r.st.Highest(ctx, scope)
	return m.Token
}

// close deletes the story's objects: the bucket is not the demo's.
func (r *s3Register) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for p := s3.NewListObjectsV2Paginator(r.api, &s3.ListObjectsV2Input{Bucket: &r.bucket, Prefix: &r.prefix}); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			return
		}
		for _, o := range page.Contents {
			_, _ = r.api.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &r.bucket, Key: o.Key})
		}
	}
}

func (*s3Register) name() string      { return "S3" }
func (*s3Register) guardName() string { return "s3guard" }
