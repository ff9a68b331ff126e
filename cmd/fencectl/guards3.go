package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fence-dev/fence/guard/s3guard"
)

// parseFollowTarget is parseGuardTarget, and also s3://BUCKET[/PREFIX],
// which guard follow takes and install does not: a bucket's marks are
// objects that s3guard writes, with nothing to install.
func parseFollowTarget(raw string) (*guardTarget, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" {
		t, err := parseGuardTarget(raw)
		if err != nil && strings.Contains(err.Error(), "unknown scheme") {
			return nil, fmt.Errorf("URL %q: unknown scheme %q: want postgres://, mysql://, redis:// or s3://", redactURL(u), u.Scheme)
		}
		return t, err
	}
	switch {
	case u.Host == "":
		return nil, errors.New("URL: name the bucket, as in s3://my-bucket or s3://my-bucket/fence/")
	case u.User != nil:
		return nil, errors.New("URL: an s3:// URL takes no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	case u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("URL %q: an s3:// URL takes no query or fragment; the endpoint of an S3-compatible server goes in AWS_ENDPOINT_URL_S3", u.Redacted())
	}
	return &guardTarget{url: u, kind: "s3"}, nil
}

// s3Prefix is where s3guard keeps its objects for an s3://BUCKET/PREFIX
// URL: PREFIX with a trailing '/', or s3guard.DefaultPrefix without one.
func s3Prefix(u *url.URL) string {
	p := strings.TrimPrefix(u.Path, "/")
	if p == "" {
		return s3guard.DefaultPrefix
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p
}

// openS3Store opens the marks of the bucket t names, with the credentials,
// region and endpoint of the standard AWS environment variables, and
// checks that the bucket answers.
func openS3Store(ctx context.Context, t *guardTarget) (*s3guard.Store, error) {
	api, err := s3FromEnv()
	if err != nil {
		return nil, err
	}
	bucket := t.url.Host
	if _, err := api.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}); err != nil {
		return nil, fmt.Errorf("cannot reach bucket %q: %w", bucket, err)
	}
	return s3guard.NewStore(api, bucket, s3guard.WithPrefix(s3Prefix(t.url))), nil
}

// s3FromEnv is an S3 client configured as the AWS tools' environment
// variables say: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// AWS_SESSION_TOKEN; AWS_REGION or AWS_DEFAULT_REGION (us-east-1 without
// them); and AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL for an S3-compatible
// server, which is then addressed path-style (http://HOST/BUCKET/KEY), as
// such servers on an address rather than a domain need.
func s3FromEnv() (*s3.Client, error) {
	key, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	if key == "" || secret == "" {
		return nil, errors.New("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary credentials)")
	}
	o := s3.Options{
		Region:      firstSet("AWS_REGION", "AWS_DEFAULT_REGION"),
		Credentials: credentials.NewStaticCredentialsProvider(key, secret, os.Getenv("AWS_SESSION_TOKEN")),
	}
	if o.Region == "" {
		o.Region = "us-east-1"
	}
	if ep := firstSet("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"); ep != "" {
		if u, err := url.Parse(ep); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL %q: want http://HOST:PORT or https://HOST:PORT", ep)
		}
		o.BaseEndpoint = aws.String(ep)
		o.UsePathStyle = true
	}
	return s3.New(o), nil
}

func firstSet(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}
