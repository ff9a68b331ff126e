package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

// rpcCounter counts the lease service's calls by method and the items the
// batch calls carry. It holds each call back by delay, as a distant or busy
// service would; with gate set, the first call waits until gate closes.
type rpcCounter struct {
	next  http.RoundTripper
	delay time.Duration
	gate  chan struct{}
	// refuse answers 404, as a service without the method does, to the
	// methods it names.
	refuse map[string]bool

	mu    sync.Mutex
	calls map[string]int
	items map[string]int
	first sync.Once
	began chan struct{} // closed when the first call arrives
}

func newRPCCounter(delay time.Duration) *rpcCounter {
	return &rpcCounter{next: http.DefaultTransport.(*http.Transport).Clone(), delay: delay,
		calls: map[string]int{}, items: map[string]int{}, began: make(chan struct{})}
}

func (rc *rpcCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	method := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	if !strings.Contains(r.URL.Path, "LeaseService") {
		return rc.next.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	n := 1
	switch method {
	case "AcquireBatch":
		var m fencev1.AcquireBatchRequest
		err, n = proto.Unmarshal(body, &m), len(m.Acquires)
	case "ReleaseBatch":
		var m fencev1.ReleaseBatchRequest
		err, n = proto.Unmarshal(body, &m), len(m.Releases)
	case "RenewBatch":
		var m fencev1.RenewBatchRequest
		err, n = proto.Unmarshal(body, &m), len(m.Renewals)
	}
	if err != nil {
		return nil, fmt.Errorf("a %s body that is not one: %w", method, err)
	}
	rc.mu.Lock()
	rc.calls[method]++
	rc.items[method] += n
	refuse := rc.refuse[method]
	rc.mu.Unlock()
	rc.first.Do(func() {
		close(rc.began)
		if rc.gate != nil {
			<-rc.gate
		}
	})
	if refuse {
		return &http.Response{StatusCode: http.StatusNotFound, Body: io.NopCloser(strings.NewReader("404 page not found")),
			Header: http.Header{"Content-Type": {"text/plain"}}, Request: r}, nil
	}
	time.Sleep(rc.delay)
	return rc.next.RoundTrip(r)
}

func (rc *rpcCounter) CloseIdleConnections() {
	rc.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

func (rc *rpcCounter) count(method string) (calls, items int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.calls[method], rc.items[method]
}

// TestConcurrentCallsShareCalls: the Acquire, Renew and Release calls of
// many goroutines on one Client go out in fewer calls than were made, and
// every caller gets its own answer: its own lease and token, or the error
// the single call would have given (held, not holder, invalid).
func TestConcurrentCallsShareCalls(t *testing.T) {
	srv, c := start(t, fencetest.WithSigning())
	rc := newRPCCounter(5 * time.Millisecond)
	shared := srv.Client(client.WithHTTPClient(&http.Client{Transport: rc}), client.WithHolder("sharer"))
	defer shared.Close()
	ctx := testContext(t)
	held := acquire(t, c, "co/held")

	const n = 64
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make(chan error, 4*n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			scope := fmt.Sprintf("co/%d", i)
			switch i % 4 {
			case 1: // a held scope
				_, err := shared.Acquire(ctx, "co/held")
				var he *fence.HeldError
				if !errors.As(err, &he) || he.Holder != "tester" || he.Token != held.Token().Value {
					errs <- fmt.Errorf("acquire of a held scope: %v; want a *fence.HeldError naming tester, token %d", err, held.Token().Value)
				}
				return
			case 2: // a TTL the service refuses
				_, err := shared.Acquire(ctx, scope, client.WithTTL(time.Millisecond))
				var inv *fence.InvalidError
				if !errors.As(err, &inv) || inv.Field != "ttl" {
					errs <- fmt.Errorf("acquire with a TTL of 1ms: %v; want a *fence.InvalidError on ttl", err)
				}
				return
			}
			l, err := shared.Grant(ctx, scope, client.WithTTL(time.Minute))
			if err != nil {
				errs <- fmt.Errorf("grant %s: %v", scope, err)
				return
			}
			if l.Scope != scope || l.Holder != "sharer" || l.Token == 0 || !l.Signed.Signed() {
				errs <- fmt.Errorf("grant %s: %+v; want a signed grant of that scope", scope, l)
				return
			}
			r, err := shared.Renew(ctx, scope, l.ID)
			if err != nil || r.Token != l.Token || r.ID != l.ID || r.Scope != scope {
				errs <- fmt.Errorf("renew %s: %+v, %v; want the lease of token %d", scope, r, err, l.Token)
			}
			if _, err := shared.Release(ctx, scope, fence.NewLeaseID()); !errors.Is(err, fence.ErrNotHolder) {
				errs <- fmt.Errorf("release of %s with another ID: %v; want fence.ErrNotHolder", scope, err)
			}
			if tok, err := shared.Release(ctx, scope, l.ID); err != nil || tok != l.Token {
				errs <- fmt.Errorf("release %s: token %d, %v; want %d", scope, tok, err, l.Token)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, m := range []struct{ single, batch string }{{"Acquire", "AcquireBatch"}, {"Renew", "RenewBatch"}, {"Release", "ReleaseBatch"}} {
		one, _ := rc.count(m.single)
		calls, items := rc.count(m.batch)
		t.Logf("%s: %d single calls, %d batch calls carrying %d", m.single, one, calls, items)
		if calls == 0 || one+calls >= one+items {
			t.Errorf("%s: %d single calls and %d batch calls for %d calls made; want batches carrying several", m.single, one, calls, one+items)
		}
	}
	for i := range n {
		if i%4 == 0 || i%4 == 3 {
			if st := get(t, c, fmt.Sprintf("co/%d", i)); st.Lease != nil || st.LastToken == 0 {
				t.Errorf("co/%d: %+v; want granted once and released", i, st)
			}
		}
	}
}

// TestLoneCallGoesAtOnce: a call that finds none in flight goes out at
// once, alone, as the single call; the calls made while it is in flight
// wait for it and then leave together.
func TestLoneCallGoesAtOnce(t *testing.T) {
	srv, _ := start(t)
	rc := newRPCCounter(0)
	rc.gate = make(chan struct{})
	shared := srv.Client(client.WithHTTPClient(&http.Client{Transport: rc}), client.WithHolder("lone"))
	defer shared.Close()
	ctx := testContext(t)

	done := make(chan error, 6)
	go func() {
		_, err := shared.Grant(ctx, "lone/0")
		done <- err
	}()
	select {
	case <-rc.began:
	case <-time.After(wait):
		t.Fatal("a lone acquire did not go out")
	}
	if one, _ := rc.count("Acquire"); one != 1 {
		t.Fatalf("%d Acquire calls; want the lone acquire sent alone", one)
	}
	for i := 1; i <= 5; i++ {
		go func() {
			_, err := shared.Grant(ctx, fmt.Sprintf("lone/%d", i))
			done <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	if one, _ := rc.count("Acquire"); one != 1 {
		t.Fatalf("%d Acquire calls while the first was in flight; want the others to wait for it", one)
	}
	close(rc.gate)
	for range 6 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	one, _ := rc.count("Acquire")
	calls, items := rc.count("AcquireBatch")
	if one != 1 || calls != 1 || items != 5 {
		t.Errorf("%d Acquire calls, %d AcquireBatch calls carrying %d; want 1, then one batch of the 5 that waited", one, calls, items)
	}
}

// TestOldServiceCalledOneByOne: a service without the batch calls answers
// them Unimplemented; the client then sends each call alone, and every
// caller still gets its answer.
func TestOldServiceCalledOneByOne(t *testing.T) {
	srv, _ := start(t)
	rc := newRPCCounter(5 * time.Millisecond)
	rc.refuse = map[string]bool{"AcquireBatch": true, "ReleaseBatch": true}
	shared := srv.Client(client.WithHTTPClient(&http.Client{Transport: rc}), client.WithHolder("old"))
	defer shared.Close()
	ctx := testContext(t)
	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := range 32 {
		wg.Go(func() {
			scope := fmt.Sprintf("old/%d", i)
			l, err := shared.Grant(ctx, scope)
			if err == nil {
				_, err = shared.Release(ctx, scope, l.ID)
			}
			if err != nil {
				failed.Add(1)
				t.Errorf("%s: %v", scope, err)
			}
		})
	}
	wg.Wait()
	if one, _ := rc.count("Acquire"); one != 32 && failed.Load() == 0 {
		t.Errorf("%d Acquire calls for 32 acquires; want each alone", one)
	}
}
