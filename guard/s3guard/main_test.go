package s3guard_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind, once the
// clients' idle connections, which the SDK keeps for the next request, are
// closed.
func TestMain(m *testing.M) {
	skipExamplesWithoutServer()
	code := m.Run()
	transport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// transport is every test client's, so that TestMain can close their
// connections.
var transport = &http.Transport{}

// defaultS3 is the server of `make services` (scripts/services.env).
const defaultS3 = "http://fence:fence-secret@127.0.0.1:18339/fence-test"

// s3Target parses FENCE_TEST_S3: http://KEY:SECRET@HOST:PORT/BUCKET.
func s3Target() (*s3.Client, string, error) {
	endpoint, key, secret, bucket, err := s3URL()
	if err != nil {
		return nil, "", err
	}
	return newClient(endpoint, key, secret), bucket, nil
}

func s3URL() (endpoint, key, secret, bucket string, err error) {
	raw := os.Getenv("FENCE_TEST_S3")
	if raw == "" {
		raw = defaultS3
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", "", "", fmt.Errorf("FENCE_TEST_S3: %w", err)
	}
	secret, _ = u.User.Password()
	bucket = strings.Trim(u.Path, "/")
	if u.Host == "" || bucket == "" || u.User.Username() == "" {
		return "", "", "", "", fmt.Errorf("FENCE_TEST_S3=%q: want http://KEY:SECRET@HOST:PORT/BUCKET", u.Redacted())
	}
	return u.Scheme + "://" + u.Host, u.User.Username(), secret, bucket, nil
}

func newClient(endpoint, key, secret string) *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(key, secret, ""),
		UsePathStyle: true, // a server on an address, not a domain with a bucket per host name
		HTTPClient:   &http.Client{Transport: transport},
	})
}

// ping says whether the server answers, making the bucket if it lacks it.
func ping(api *s3.Client, bucket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// One attempt: a server that is not there is not retried for seconds
	// by every test that skips.
	once := func(o *s3.Options) { o.RetryMaxAttempts = 1 }
	_, err := api.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}, once)
	if _, missing := errors.AsType[*types.NotFound](err); missing {
		_, err = api.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &bucket})
	}
	return err
}

// skipOrFail skips a test that needs the S3 server when it is missing,
// except in CI, where a missing server is a failure.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (run `make services`, or set FENCE_TEST_S3)")
}

// testS3 returns a client of the test server, its bucket, and a key prefix
// of this test's own, whose objects are deleted when the test ends.
func testS3(t testing.TB) (api *s3.Client, bucket, prefix string) {
	t.Helper()
	api, bucket, err := s3Target()
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(api, bucket); err != nil {
		skipOrFail(t, "the S3 server of FENCE_TEST_S3 is unreachable: %v", err)
	}
	prefix = fmt.Sprintf("s3guard-test/%d-%d/", time.Now().UnixNano(), rand.Uint32())
	t.Cleanup(func() { deleteAll(t, api, bucket, prefix) })
	return api, bucket, prefix
}

func deleteAll(t testing.TB, api *s3.Client, bucket, prefix string) {
	ctx := context.Background()
	for _, key := range keys(t, api, bucket, prefix) {
		if _, err := api.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &key}); err != nil {
			t.Logf("cleanup: delete %s: %v", key, err)
		}
	}
}

// keys lists the keys under prefix, sorted.
func keys(t testing.TB, api *s3.Client, bucket, prefix string) []string {
	t.Helper()
	var out []string
	for p := s3.NewListObjectsV2Paginator(api, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix}); p.HasMorePages(); {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("list %s: %v", prefix, err)
		}
		for _, o := range page.Contents {
			out = append(out, aws.ToString(o.Key))
		}
	}
	return out
}

// skipExamplesWithoutServer makes the examples, whose output is what a
// real server answers, skip like the tests when the server is unreachable;
// in CI they run, and fail. An example cannot skip itself, so this adds
// ^Example to -test.skip before the tests start. Called by TestMain.
func skipExamplesWithoutServer() {
	flag.Parse()
	if os.Getenv("CI") == "true" {
		return
	}
	api, bucket, err := s3Target()
	if err == nil {
		err = ping(api, bucket)
	}
	if err == nil {
		return
	}
	skip := flag.Lookup("test.skip").Value.String()
	if strings.Contains(skip, "/") {
		return // cannot join a pattern with subtests; let the examples fail
	}
	if skip != "" {
		skip += "|"
	}
	_ = flag.Set("test.skip", skip+"^Example")
	fmt.Fprintf(os.Stderr, "s3guard: skipping the examples: the S3 server is unreachable: %v (run `make services`, or set FENCE_TEST_S3)\n", err)
}
