package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/guard/s3guard"
	"github.com/fence-dev/fence/signing"
)

// s3Handler is the s3 store's write handler: each scope's body put to
// the bucket of raw (http://KEY:SECRET@HOST:PORT/BUCKET) under a prefix of
// this resource's own, plainly or through s3guard when keys is not nil.
// Closing it deletes everything under the prefix: the server is shared.
func s3Handler(ctx context.Context, keys *signing.KeySet, raw string) (http.Handler, func(), error) {
	api, bucket, hc, err := s3Client(raw)
	if err != nil {
		return nil, nil, err
	}
	prefix := fmt.Sprintf("bench-peers/%d/", time.Now().UnixNano())
	closer := func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		deleteUnder(cctx, api, bucket, prefix)
		hc.CloseIdleConnections()
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := api.HeadBucket(pctx, &s3.HeadBucketInput{Bucket: &bucket}); err != nil {
		if _, missing := errors.AsType[*types.NotFound](err); !missing {
			closer()
			return nil, nil, fmt.Errorf("bucket %q: %w", bucket, err)
		}
		if _, err := api.CreateBucket(pctx, &s3.CreateBucketInput{Bucket: &bucket}); err != nil {
			closer()
			return nil, nil, fmt.Errorf("create bucket %q: %w", bucket, err)
		}
	}
	if keys == nil {
		return write(func(r *http.Request, body []byte) error {
			key := prefix + "plain/" + r.PathValue("scope")
			_, err := api.PutObject(r.Context(), &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(body)})
			return err
		}), closer, nil
	}
	g := s3guard.New(api, bucket, s3guard.WithPrefix(prefix), s3guard.WithVerifier(keys))
	return write(func(r *http.Request, body []byte) error {
		tok, err := fence.ParseToken(r.Header.Get(httpguard.TokenHeader))
		if err != nil {
			return badRequest{err}
		}
		return g.Put(r.Context(), guard.Write{Token: tok}, "data", body)
	}), closer, nil
}

// s3Client returns a client of the server and the bucket raw names, with
// an HTTP transport that keeps a connection for each of many concurrent
// writers (the SDK's default keeps 10 idle ones a host, and 64 workers
// would open new ones all the time).
func s3Client(raw string) (*s3.Client, string, *http.Transport, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", nil, fmt.Errorf("-s3: %w", err)
	}
	secret, _ := u.User.Password()
	bucket := strings.Trim(u.Path, "/")
	if u.Host == "" || bucket == "" || u.User.Username() == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, "", nil, fmt.Errorf("-s3 %q: want http://KEY:SECRET@HOST:PORT/BUCKET", u.Redacted())
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	api := s3.New(s3.Options{
		BaseEndpoint: aws.String(u.Scheme + "://" + u.Host),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(u.User.Username(), secret, ""),
		UsePathStyle: true, // a server on an address, not a bucket per host name
		HTTPClient:   &http.Client{Transport: tr},
	})
	return api, bucket, tr, nil
}

// deleteUnder deletes every object under prefix, best effort.
func deleteUnder(ctx context.Context, api *s3.Client, bucket, prefix string) {
	for p := s3.NewListObjectsV2Paginator(api, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix}); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			logf("s3: list %s: %v", prefix, err)
			return
		}
		for _, o := range page.Contents {
			if _, err := api.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: o.Key}); err != nil {
				logf("s3: delete %s: %v", aws.ToString(o.Key), err)
			}
		}
	}
}
