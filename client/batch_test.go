package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
)

// TestRenewBatch: one call renews each lease on its own; a lease that is no
// longer current gets Renew's error and does not hold back the others.
func TestRenewBatch(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)
	var leases []fence.Lease
	for _, scope := range []string{"a", "b", "c"} {
		l, err := c.Grant(ctx, scope, client.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if _, err := c.Release(ctx, "b", leases[1].ID); err != nil {
		t.Fatal(err)
	}
	rs := make([]client.Renewal, len(leases))
	for i, l := range leases {
		rs[i] = client.Renewal{Scope: l.Scope, ID: l.ID}
	}
	got, err := c.RenewBatch(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2} {
		if got[i].Err != nil || got[i].ExpiresIn != time.Minute {
			t.Errorf("%s: %+v; want renewed for its TTL of 1m", leases[i].Scope, got[i])
		}
	}
	var lost *fence.LostError
	if !errors.As(got[1].Err, &lost) || lost.Token != leases[1].Token || !strings.Contains(got[1].Err.Error(), `renew "b"`) {
		t.Errorf("released b: %v; want lost, token %d", got[1].Err, leases[1].Token)
	}
	if _, single := c.Renew(ctx, "b", leases[1].ID); single.Error() != got[1].Err.Error() {
		t.Errorf("batch said %q, Renew says %q", got[1].Err, single)
	}

	if r, err := c.RenewBatch(ctx, nil); r != nil || err != nil {
		t.Errorf("an empty batch: %v, %v; want nothing", r, err)
	}
	_, err = c.RenewBatch(ctx, []client.Renewal{{Scope: "a", ID: leases[0].ID}, {Scope: "", ID: leases[0].ID}})
	var inv *fence.InvalidError
	if !errors.As(err, &inv) || inv.Field != "renewals[1].scope" {
		t.Errorf("a batch with an empty scope: %v; want invalid renewals[1].scope", err)
	}
}

// batchCounter counts RenewBatch calls and the renewals they carry, and
// holds each call back a little, as a distant or busy service would.
type batchCounter struct {
	next            http.RoundTripper
	calls, renewals atomic.Int64
}

func (bc *batchCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/RenewBatch") {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var m fencev1.RenewBatchRequest
		if err := proto.Unmarshal(body, &m); err != nil {
			return nil, fmt.Errorf("a RenewBatch body that is not one: %w", err)
		}
		bc.calls.Add(1)
		bc.renewals.Add(int64(len(m.Renewals)))
		time.Sleep(20 * time.Millisecond)
	}
	return bc.next.RoundTrip(r)
}

func (bc *batchCounter) CloseIdleConnections() {
	bc.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// TestKeepAlivesShareCalls: the leases of one client renew together, in
// fewer calls than renewals, and every one of them stays held.
func TestKeepAlivesShareCalls(t *testing.T) {
	srv, c := start(t)
	bc := &batchCounter{next: http.DefaultTransport.(*http.Transport).Clone()}
	counted := srv.Client(client.WithHTTPClient(&http.Client{Transport: bc}), client.WithHolder("batcher"))
	defer counted.Close()
	const n = 100
	leases := make([]*client.Lease, n)
	for i := range leases {
		leases[i] = acquire(t, counted, fmt.Sprintf("keep/%d", i), client.WithTTL(600*time.Millisecond))
	}
	eventually(t, "every lease renewed a few times", func() bool { return bc.renewals.Load() >= 5*n })
	for _, l := range leases {
		if err := l.Err(); err != nil {
			t.Fatalf("%s: %v", l.Scope(), err)
		}
		if st := get(t, c, l.Scope()); st.Lease == nil || st.Lease.Token != l.Token().Value {
			t.Fatalf("%s: %+v; want held with token %d", l.Scope(), st.Lease, l.Token().Value)
		}
	}
	calls, renewals := bc.calls.Load(), bc.renewals.Load()
	t.Logf("%d renewals in %d calls", renewals, calls)
	if calls*4 > renewals {
		t.Errorf("%d renewals in %d calls; want the calls to carry several each", renewals, calls)
	}
}
