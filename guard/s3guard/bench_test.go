package s3guard_test

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fence-dev/fence/guard/s3guard"
)

// BenchmarkPut compares a write through the guard with a plain PutObject
// of the same 4 KiB to the same server: the guard's price is its extra
// requests (the mark's GET and conditional PUT, and the DELETE of the
// data it replaces), and all writes of one scope are serial through its
// mark, so the "one scope" case is the rate one scope can take.
func BenchmarkPut(b *testing.B) {
	ctx := context.Background()
	api, bucket, prefix := testS3(b)
	body := bytes.Repeat([]byte("x"), 4096)
	b.Run("plain", func(b *testing.B) {
		key := prefix + "plain"
		for b.Loop() {
			if _, err := api.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(body)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guard", func(b *testing.B) {
		g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
		for b.Loop() {
			if err := g.Put(ctx, w("bench", 1, 0), "object", body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guard-parallel-scopes", func(b *testing.B) {
		g := s3guard.New(api, bucket, quiet, s3guard.WithPrefix(prefix))
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			scope := fmt.Sprintf("bench/%d", n.Add(1)) // a scope per goroutine
			for pb.Next() {
				if err := g.Put(ctx, w(scope, 1, 0), "object", body); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
