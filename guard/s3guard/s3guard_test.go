package s3guard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/s3guard"
)

// quiet keeps the Guards of the tests from logging the refusals they
// provoke.
var quiet = s3guard.WithLogger(slog.New(slog.DiscardHandler))

func w(scope string, token, seq uint64) guard.Write {
	return guard.Write{Token: fence.Token{Scope: scope, Value: token}, Seq: seq}
}

// TestStoreConformance runs guardtest against the mark objects, reopened
// as a new Store over the same prefix (a restarted process).
func TestStoreConformance(t *testing.T) {
	api, bucket, prefix := testS3(t)
	guardtest.Run(t, guardtest.Harness{
		Open: func(t *testing.T) guard.Store { return s3guard.NewStore(api, bucket, s3guard.WithPrefix(prefix)) },
		Reopen: func(t *testing.T, _ guard.Store) guard.Store {
			return s3guard.NewStore(api, bucket, s3guard.WithPrefix(prefix))
		},
	})
}

// TestGuardMatchesCheck presents random writes through Put and compares
// every outcome with guard.Check.
func TestGuardMatchesCheck(t *testing.T) {
	api, bucket, prefix := testS3(t)
	gs := map[bool]*s3guard.Guard{
		false: s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix)),
		true:  s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix), s3guard.WithStrictSequence()),
	}
	guardtest.MatchesCheck(t, func(wr guard.Write, strict bool) error {
		return gs[strict].Put(context.Background(), wr, "object", []byte("x"))
	})
}

func TestPutGetDelete(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
	const scope = "orders/eu.west"
	if err := g.Put(ctx, w(scope, 7, 0), "report.csv", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, w(scope, 7, 0), "manifest.json", []byte("m1")); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, w(scope, 8, 0), "report.csv", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	got, err := g.Get(ctx, scope, "report.csv")
	if err != nil || string(got) != "v2" {
		t.Fatalf("Get = %q, %v; want v2", got, err)
	}
	names, err := g.Names(ctx, scope)
	if err != nil || strings.Join(names, ",") != "manifest.json,report.csv" {
		t.Fatalf("Names = %q, %v", names, err)
	}
	if m, err := g.Highest(ctx, scope); err != nil || m != (guard.Mark{Token: 8}) {
		t.Fatalf("Highest = %+v, %v; want token 8", m, err)
	}
	// The mark object and the two objects' current data, nothing else:
	// the replaced version was deleted.
	all := keys(t, api, bucket, prefix)
	if len(all) != 3 || !strings.HasSuffix(all[2], "marks/orders%2Feu%2Ewest") {
		t.Fatalf("keys %q; want two data keys and the mark", all)
	}
	if err := g.Delete(ctx, w(scope, 8, 0), "report.csv"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Get(ctx, scope, "report.csv"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Get after Delete: %v, want fs.ErrNotExist", err)
	}
	if err := g.Delete(ctx, w(scope, 8, 0), "never-written"); err != nil {
		t.Fatalf("Delete of a name the scope lacks: %v", err)
	}
	if got, err := g.Get(ctx, scope, "manifest.json"); err != nil || string(got) != "m1" {
		t.Fatalf("Get manifest.json = %q, %v", got, err)
	}
}

// TestStaleWriterAfterNewer: once a newer holder wrote, the older one's
// put, delete and commit are refused with its token and the highest, and
// the bucket keeps the newer data; the refused put's data is gone.
func TestStaleWriterAfterNewer(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
	const scope = "jobs/nightly"
	if err := g.Put(ctx, w(scope, 41, 0), "out", []byte("from 41")); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, w(scope, 42, 0), "out", []byte("from 42")); err != nil {
		t.Fatal(err)
	}
	before := keys(t, api, bucket, prefix)
	check := func(op string, err error) {
		t.Helper()
		stale, ok := errors.AsType[*guard.StaleError](err)
		if !ok || !errors.Is(err, fence.ErrStale) || stale.Presented != 41 || stale.Highest != 42 || stale.Scope != scope {
			t.Fatalf("stale %s: %v; want a StaleError presenting 41 over 42", op, err)
		}
	}
	check("put", g.Put(ctx, w(scope, 41, 0), "out", []byte("late from 41")))
	check("put of a new name", g.Put(ctx, w(scope, 41, 0), "other", []byte("late from 41")))
	check("delete", g.Delete(ctx, w(scope, 41, 0), "out"))
	key := g.NewKey(w(scope, 41, 0))
	if _, err := api.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader("staged by 41")}); err != nil {
		t.Fatal(err)
	}
	check("commit", g.Commit(ctx, w(scope, 41, 0), "out", key))
	if got, err := g.Get(ctx, scope, "out"); err != nil || string(got) != "from 42" {
		t.Fatalf("Get = %q, %v; want the newer holder's data", got, err)
	}
	if after := keys(t, api, bucket, prefix); strings.Join(after, " ") != strings.Join(before, " ") {
		t.Fatalf("keys after the refused writes %q, before %q", after, before)
	}
}

// TestCommitMultipart: data uploaded in parts to a NewKey becomes visible
// only at Commit; keys that are not the scope's are refused.
func TestCommitMultipart(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
	const scope = "tables/t1"
	wr := w(scope, 3, 0)
	key := g.NewKey(wr)
	up, err := api.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: &key})
	if err != nil {
		t.Fatal(err)
	}
	part, err := api.UploadPart(ctx, &s3.UploadPartInput{Bucket: &bucket, Key: &key, UploadId: up.UploadId,
		PartNumber: aws.Int32(1), Body: bytes.NewReader([]byte("one part"))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Get(ctx, scope, "data"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Get before the commit: %v, want fs.ErrNotExist", err)
	}
	_, err = api.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &bucket, Key: &key, UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: []types.CompletedPart{{ETag: part.ETag, PartNumber: aws.Int32(1)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Commit(ctx, wr, "data", key); err != nil {
		t.Fatal(err)
	}
	if got, err := g.Get(ctx, scope, "data"); err != nil || string(got) != "one part" {
		t.Fatalf("Get = %q, %v", got, err)
	}
	for _, bad := range []string{
		prefix + "marks/tables%2Ft1",    // the mark itself
		g.NewKey(w("tables/t2", 3, 0)),  // another scope's data
		key,                             // already named (by "data")
		prefix + "data/tables%2Ft1/x/y", // not a key NewKey makes
		"elsewhere/in/the/bucket",       // outside the prefix
	} {
		if err := g.Commit(ctx, wr, "other", bad); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Commit(%q) = %v, want fence.ErrInvalid", bad, err)
		}
	}
	if err := g.Commit(ctx, wr, "other", g.NewKey(wr)); err == nil || errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Commit of a key never uploaded = %v, want an error from the server", err)
	}
}

// TestBadInput: writes no service issues, and bad names, are refused
// before any request.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
	for _, c := range []struct {
		wr   guard.Write
		name string
	}{
		{w("s", 0, 0), "a"},
		{w("s", fence.MaxToken+1, 0), "a"},
		{w("", 5, 0), "a"},
		{w("s", 5, 0), ""},
		{w("s", 5, 0), "\xff"},
		{w("s", 5, 0), strings.Repeat("n", 1025)},
	} {
		if err := g.Put(ctx, c.wr, c.name, nil); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Put(%+v, %q) = %v, want fence.ErrInvalid", c.wr, c.name, err)
		}
	}
	if k := keys(t, api, bucket, prefix); len(k) != 0 {
		t.Fatalf("refused writes left %q", k)
	}
}

// TestCorruptMark: a mark object that is not one is an error, and no
// write replaces it.
func TestCorruptMark(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
	for i, body := range []string{`not json`, `{}`, `{"token":"7","extra":1}`, `{"token":7}`} {
		scope := fmt.Sprintf("corrupt/%d", i)
		key := g.MarkKey(scope)
		if _, err := api.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(body)}); err != nil {
			t.Fatal(err)
		}
		if err := g.Put(ctx, w(scope, 9, 0), "a", []byte("x")); err == nil || errors.Is(err, fence.ErrStale) {
			t.Errorf("Put over the mark %s = %v, want an error", body, err)
		}
	}
}

// TestStoreSuperseded: a Store's apply during which another process
// advances the mark past the write; the swap then fails, and Fence reports
// the write stale after apply ran. An advance that does not pass the
// write (the same token) only makes the swap retry.
func TestStoreSuperseded(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	a := s3guard.NewStore(api, bucket, s3guard.WithPrefix(prefix))
	b := s3guard.NewStore(api, bucket, s3guard.WithPrefix(prefix)) // another process
	noop := func(context.Context) error { return nil }
	const scope = "superseded"
	err := a.Fence(ctx, w(scope, 5, 0), false, func(ctx context.Context) error {
		return b.Fence(ctx, w(scope, 6, 0), false, noop)
	})
	stale, ok := errors.AsType[*guard.StaleError](err)
	if !errors.Is(err, s3guard.ErrSuperseded) || !ok || stale.Presented != 5 || stale.Highest != 6 {
		t.Fatalf("Fence = %v, want ErrSuperseded with presented 5, highest 6", err)
	}
	err = a.Fence(ctx, w(scope, 7, 0), false, func(ctx context.Context) error {
		return b.Fence(ctx, w(scope, 7, 0), false, noop)
	})
	if err != nil {
		t.Fatalf("Fence after an advance to the same token: %v", err)
	}
	if m, err := a.Highest(ctx, scope); err != nil || m.Token != 7 {
		t.Fatalf("Highest = %+v, %v; want 7", m, err)
	}
}

// TestRace has many writers, old and new holders spread over several
// Guards (as over several processes, each with its own lock table, so
// that they meet only at the mark's compare-and-swap), write the same
// object with random delays. The history must show no write accepted
// after a write with a higher token had returned, every refusal must name
// a higher token, and the object must end holding an accepted write of
// the highest token that was not followed by another one.
func TestRace(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	const (
		guards  = 4
		writers = 16
		writes  = 8
		scope   = "race"
	)
	gs := make([]*s3guard.Guard, guards)
	for i := range gs {
		gs[i] = s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
	}
	type op struct {
		token      uint64
		body       string
		start, end int64
		accepted   bool
	}
	var (
		clock atomic.Int64
		mu    sync.Mutex
		ops   []op
		wg    sync.WaitGroup
	)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := gs[i%guards]
			token := uint64(1 + i%5) // five epochs, several writers in each
			for j := range writes {
				time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
				body := fmt.Sprintf("%d/%d/%d", token, i, j)
				start := clock.Add(1)
				err := g.Put(ctx, w(scope, token, 0), "object", []byte(body))
				end := clock.Add(1)
				if stale, ok := errors.AsType[*guard.StaleError](err); ok {
					if stale.Highest <= token {
						t.Errorf("refused %d with highest %d", token, stale.Highest)
					}
				} else if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ops = append(ops, op{token, body, start, end, err == nil})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var top uint64
	for _, a := range ops {
		if !a.accepted {
			continue
		}
		top = max(top, a.token)
		for _, b := range ops {
			if b.accepted && b.token > a.token && b.end < a.start {
				t.Fatalf("token %d accepted (at %d) after token %d had been (by %d)", a.token, a.start, b.token, b.end)
			}
		}
	}
	if top != 5 {
		t.Fatalf("highest accepted token %d, want 5", top)
	}
	got, err := gs[0].Get(ctx, scope, "object")
	if err != nil {
		t.Fatal(err)
	}
	var final *op
	for i := range ops {
		if ops[i].body == string(got) {
			final = &ops[i]
		}
	}
	if final == nil || !final.accepted || final.token != top {
		t.Fatalf("the object holds %q, not an accepted write of token %d", got, top)
	}
	for _, b := range ops {
		if b.accepted && b.token == top && b.start > final.end {
			t.Fatalf("the object holds %q, but %q was accepted after it", got, b.body)
		}
	}
	if m, err := gs[0].Highest(ctx, scope); err != nil || m.Token != top {
		t.Fatalf("Highest = %+v, %v; want %d", m, err, top)
	}
	// The data of refused and replaced writes is gone: one data object left.
	var data []string
	for _, k := range keys(t, api, bucket, prefix) {
		if strings.Contains(k, "/data/") {
			data = append(data, k)
		}
	}
	if len(data) != 1 {
		t.Errorf("%d data objects left, want 1: %q", len(data), data)
	}
}

// TestForeignKeyInMark: a mark edited by hand to name another scope's
// data, or a key outside the guard's prefix, never makes a write delete
// that data when it replaces the name.
func TestForeignKeyInMark(t *testing.T) {
	ctx := context.Background()
	api, bucket, prefix := testS3(t)
	g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
	if err := g.Put(ctx, w("other", 1, 0), "data", []byte("other's")); err != nil {
		t.Fatal(err)
	}
	theirs := keys(t, api, bucket, prefix+"data/")
	outside := prefix + "elsewhere"
	if _, err := api.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &outside, Body: strings.NewReader("outside")}); err != nil {
		t.Fatal(err)
	}
	mark := fmt.Sprintf(`{"token":"1","seq":"0","commit":"x","objects":{"a":%q,"b":%q}}`, theirs[0], outside)
	key := g.MarkKey("mine")
	if _, err := api.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(mark)}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if err := g.Put(ctx, w("mine", 2, 0), name, []byte("mine")); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Delete(ctx, w("mine", 2, 0), "a"); err != nil {
		t.Fatal(err)
	}
	if got, err := g.Get(ctx, "other", "data"); err != nil || string(got) != "other's" {
		t.Fatalf("the other scope's object: %q, %v", got, err)
	}
	if _, err := api.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: &outside}); err != nil {
		t.Fatalf("the object outside the data prefix: %v", err)
	}
}
