package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/s3guard"
)

// TestGuardFollowS3: `fencectl guard follow s3://BUCKET/PREFIX`, with the
// credentials and endpoint in the AWS environment variables, advances the
// bucket's marks at each release and expiry, so that an ended lease's late
// write through s3guard is refused before anyone else wrote; in a scope no
// follower covers, the same late write is accepted.
func TestGuardFollowS3(t *testing.T) {
	api, bucket := testBucket(t)
	prefix := fmt.Sprintf("fencectl-follow/%08x/", rand.Uint32())
	t.Cleanup(func() {
		ctx := context.Background()
		p := s3.NewListObjectsV2Paginator(api, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				return
			}
			for _, o := range page.Contents {
				api.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: o.Key})
			}
		}
	})
	s := startFenced(t)
	c, err := client.New(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// No trailing '/': fencectl adds it, as s3guard's prefix needs.
	startGuardFollow(t, s, "s3://"+bucket+"/"+strings.TrimSuffix(prefix, "/"), "followed/")
	g := s3guard.New(api, bucket, s3guard.WithPrefix(prefix))
	write := func(scope string, token uint64) error {
		return g.Put(context.Background(), guard.Write{Token: fence.Token{Scope: scope, Value: token}}, "out", []byte("v"))
	}
	for _, end := range []string{"released", "expired"} {
		for _, scope := range []string{"followed/" + end, "unfollowed/" + end} {
			token, err := followScenario(t, c, scope, end, write)
			if strings.HasPrefix(scope, "followed/") {
				if stale, ok := errors.AsType[*guard.StaleError](err); !ok || stale.Highest != token+1 {
					t.Errorf("%s with a follower: late write %v; want refused by the closing token %d", scope, err, token+1)
				}
			} else if err != nil {
				t.Errorf("%s without a follower: late write %v; want accepted (the window the follower closes)", scope, err)
			}
		}
	}
}

// testBucket sets the AWS environment for the test S3 server
// (FENCE_TEST_S3, default scripts/services.env's), which fencectl then
// reaches, and returns a client of it and its bucket; it skips the test
// when the server does not answer, or fails it in CI (needServer).
func testBucket(t *testing.T) (*s3.Client, string) {
	t.Helper()
	raw := needServer(t, "FENCE_TEST_S3", "http://fence:fence-secret@127.0.0.1:18339/fence-test", func(raw string) error {
		_, _, err := s3Env(t, raw)
		return err
	})
	api, bucket, err := s3Env(t, raw)
	if err != nil {
		t.Fatal(err)
	}
	return api, bucket
}

// s3Env points the AWS environment variables, which fencectl reads, at
// the S3 server of raw (http://KEY:SECRET@HOST:PORT/BUCKET) for the rest
// of the test, and returns a client from them and the bucket, once it
// answers.
func s3Env(t *testing.T, raw string) (*s3.Client, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", err
	}
	secret, _ := u.User.Password()
	t.Setenv("AWS_ACCESS_KEY_ID", u.User.Username())
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ENDPOINT_URL_S3", u.Scheme+"://"+u.Host)
	api, err := s3FromEnv()
	if err != nil {
		return nil, "", err
	}
	bucket := strings.Trim(u.Path, "/")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	once := func(o *s3.Options) { o.RetryMaxAttempts = 1 } // a missing server is not retried for seconds
	if _, err := api.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}, once); err != nil {
		return nil, "", err
	}
	return api, bucket, nil
}

// TestParseFollowTargetS3: an s3:// URL names a bucket and an optional
// prefix, and nothing else; credentials in it are refused, not used.
func TestParseFollowTargetS3(t *testing.T) {
	for raw, want := range map[string]string{
		"s3://b":          s3guard.DefaultPrefix,
		"s3://b/":         s3guard.DefaultPrefix,
		"s3://b/app":      "app/",
		"s3://b/app/f/":   "app/f/",
		"s3:///nobucket":  "name the bucket",
		"s3://k:s@b/":     "takes no credentials",
		"s3://b/?x=1":     "no query",
		"ftp://b/":        "or s3:",
		"redis://h:6379/": "",
	} {
		tg, err := parseFollowTarget(raw)
		switch {
		case err != nil:
			if want == "" || strings.HasSuffix(want, "/") || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want %q", raw, err, want)
			}
			if strings.Contains(err.Error(), ":s@") {
				t.Errorf("%s: the error quotes the secret: %v", raw, err)
			}
		case tg.kind == "s3":
			if got := s3Prefix(tg.url); got != want {
				t.Errorf("%s: prefix %q, want %q", raw, got, want)
			}
		case want != "":
			t.Errorf("%s: kind %q, want an error %q", raw, tg.kind, want)
		}
	}
}
