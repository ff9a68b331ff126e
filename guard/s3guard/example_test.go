package s3guard_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/s3guard"
)

// A lease holder writes an object with its token; after a newer holder
// has written, the old one's late write is refused and the bucket keeps
// the newer data. It runs against the S3 server of `make services` (or
// FENCE_TEST_S3).
func Example() {
	ctx := context.Background()
	api, bucket, err := s3Target() // an *s3.Client, e.g. s3.NewFromConfig(cfg), and a bucket name
	if err != nil {
		fmt.Println(err)
		return
	}
	// A prefix of the example's own, emptied first: it runs again and again.
	if err := reset(ctx, "s3guard-example/"); err != nil {
		fmt.Println(err)
		return
	}
	g := s3guard.New(api, bucket, s3guard.WithPrefix("s3guard-example/"))
	const scope = "example/orders"
	a := guard.Write{Token: fence.Token{Scope: scope, Value: 41}}
	b := guard.Write{Token: fence.Token{Scope: scope, Value: 42}}

	if err := g.Put(ctx, b, "manifest.json", []byte(`{"from":"B"}`)); err != nil {
		fmt.Println(err)
		return
	}
	err = g.Put(ctx, a, "manifest.json", []byte(`{"from":"A"}`))
	var stale *guard.StaleError
	if errors.As(err, &stale) {
		fmt.Printf("refused: presented %d, highest %d\n", stale.Presented, stale.Highest)
	}
	data, _ := g.Get(ctx, scope, "manifest.json")
	fmt.Println(string(data))
	// Output:
	// refused: presented 41, highest 42
	// {"from":"B"}
}

// reset deletes what an earlier run of the example left under prefix.
func reset(ctx context.Context, prefix string) error {
	api, bucket, err := s3Target()
	if err != nil {
		return err
	}
	for p := s3.NewListObjectsV2Paginator(api, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix}); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, o := range page.Contents {
			if _, err := api.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: o.Key}); err != nil {
				return err
			}
		}
	}
	return nil
}
