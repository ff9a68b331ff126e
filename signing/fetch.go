package signing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Fetch reads the key set fenced serves at /keys. addr is "host:port", an
// http:// or https:// URL, or a comma-separated list of them (a cluster):
// the first that answers is used. Every node of a cluster serves the same
// keys. A bare host:port is fetched over plain HTTP.
//
// A fenced that serves TLS (--tls-cert) needs https:// URLs and an h whose
// transport trusts the service's CA (README, "Signed tokens"); a plain
// request to it fails saying so. A nil h is http.DefaultClient.
func Fetch(ctx context.Context, h *http.Client, addr string) (*KeySet, error) {
	if h == nil {
		h = http.DefaultClient
	}
	var errs []error
	for a := range strings.SplitSeq(addr, ",") {
		a = strings.TrimSuffix(strings.TrimSpace(a), "/")
		if !strings.Contains(a, "://") {
			a = "http://" + a
		}
		set, err := fetch(ctx, h, a+"/keys")
		if err == nil {
			return set, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("fetch signing keys: %w", errors.Join(errs...))
}

func fetch(ctx context.Context, h *http.Client, url string) (*KeySet, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.Do(req)
	if err != nil {
		return nil, explainTLS(url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusBadRequest && strings.Contains(string(b), "HTTP request to an HTTPS server") {
		// Go's TLS server answers a plain request so.
		return nil, fmt.Errorf("%s: the server speaks TLS: use https://%s and an *http.Client whose transport trusts the service's CA", url, req.URL.Host)
	}
	if resp.StatusCode != http.StatusOK {
		// fenced says why in the body's first line (a node not ready).
		why, _, _ := strings.Cut(string(b[:min(len(b), 300)]), "\n")
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(why))
	}
	return Parse(b)
}

// explainTLS says what to change when err is a TLS mismatch between the
// URL's scheme, the client and the server.
func explainTLS(url string, err error) error {
	var unknownCA x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	switch {
	case errors.As(err, &unknownCA) || errors.As(err, &verify):
		return fmt.Errorf("%s: the server's certificate is not trusted: give an *http.Client whose transport trusts the service's CA: %w", url, err)
	case errors.As(err, &record) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("%s: the server does not speak TLS: use http:// or a bare host:port: %w", url, err)
	}
	return err
}

// Refreshing returns a key set fetched from the service that fetches the
// keys again when it meets a key ID it does not know, so a rotation reaches
// the guard without a restart.
//
// It fetches at most once per minInterval, however many tokens of unknown
// key IDs it meets: a forged token costs the service no request beyond
// that. An attacker who spends that fetch on a made-up key ID does not
// keep a new key out either: fenced publishes a new key for
// --key-publish-delay (5m by default) before it signs with it, so when the
// first token of the new key arrives, the last fetch either came after the
// key was published, and brought it, or more than minInterval ago, and
// another is allowed. Keep minInterval below fenced's --key-publish-delay;
// a minute is a good choice. 0 fetches at every unknown key ID, which only
// tests should do.
func Refreshing(ctx context.Context, h *http.Client, addr string, minInterval time.Duration) (*KeySet, error) {
	set, err := Fetch(ctx, h, addr)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	last := set.now() // the set is fresh
	var fetches atomic.Uint64
	set.refresh = func() bool {
		seen := fetches.Load()
		mu.Lock()
		defer mu.Unlock()
		if fetches.Load() != seen {
			return true // fetched while this caller waited: look again
		}
		now := set.now()
		if now.Sub(last) < minInterval {
			return false
		}
		last = now
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fresh, err := Fetch(ctx, h, addr)
		if err != nil {
			return false
		}
		set.Replace(fresh.Keys())
		fetches.Add(1)
		return true
	}
	return set, nil
}
