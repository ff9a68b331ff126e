package signing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Fetch reads the key set fenced serves at /keys. addr is "host:port" or
// an http:// URL, or a comma-separated list of them (a cluster): the first
// that answers is used. Every node of a cluster serves the same keys.
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
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return Parse(b)
}

// Refreshing returns a key set fetched from the service that fetches the
// keys again, at most once per minInterval, when it meets a key ID it does
// not know: a rotation then reaches the guard without a restart.
func Refreshing(ctx context.Context, h *http.Client, addr string, minInterval time.Duration) (*KeySet, error) {
	set, err := Fetch(ctx, h, addr)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var last time.Time
	set.refresh = func() bool {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) < minInterval {
			return false
		}
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fresh, err := Fetch(ctx, h, addr)
		if err != nil {
			return false
		}
		set.Replace(fresh.Keys())
		return true
	}
	return set, nil
}
