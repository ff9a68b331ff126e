package httpguard_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/guard/internal/rerun"
)

// TestRepeatingStoreNeedsOptIn: Middleware refuses a guard whose store
// may run a handler more than once (boltguard's Batched), with an error
// that names the option that accepts it, and accepts it with that option.
// A store that runs each handler once needs no option.
func TestRepeatingStoreNeedsOptIn(t *testing.T) {
	store, err := boltguard.Open(filepath.Join(t.TempDir(), "data.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := httpguard.Middleware(guard.New(store), "orders"); err != nil {
		t.Errorf("Middleware over the Store, which runs each handler once: %v", err)
	}
	m, err := httpguard.Middleware(guard.New(store.Batched()), "orders")
	if m != nil || err == nil || !strings.Contains(err.Error(), "WithRepeats") || !strings.Contains(err.Error(), "Batched") {
		t.Errorf("Middleware over the Batched store without WithRepeats: %v; want an error naming the store and WithRepeats", err)
	}
	if _, err := httpguard.Middleware(guard.New(store.Batched()), "orders", httpguard.WithRepeats()); err != nil {
		t.Errorf("Middleware over the Batched store with WithRepeats: %v", err)
	}
}

// TestBatchedStoreRunsHandlersAgain: over boltguard's Batched store, a
// write that fails in a shared transaction makes bbolt run the others
// again. A handler run again must read the whole request body again, and
// the client must get the answer of the run whose writes were kept. Direct
// UpdateBatch calls that always fail share the batches with the requests,
// so reruns happen; the test counts them and fails if there were none.
func TestBatchedStoreRunsHandlersAgain(t *testing.T) {
	store, err := boltguard.Open(filepath.Join(t.TempDir(), "data.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	data := []byte("data")
	if err := store.DB().Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket(data)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, _ := boltguard.TxFromContext(r.Context())
		var body []byte
		buf := make([]byte, 100) // several reads a body
		for {
			n, err := r.Body.Read(buf)
			body = append(body, buf[:n]...)
			if err != nil {
				break
			}
		}
		if err := tx.Bucket(data).Put([]byte(r.PathValue("scope")), body); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "stored %d bytes", len(body))
	})
	mux := http.NewServeMux()
	mux.Handle("POST /write/{scope}", mustMiddleware(t, guard.New(store.Batched()), "", httpguard.WithRepeats(),
		httpguard.WithScopeFunc(func(r *http.Request) string { return r.PathValue("scope") }))(write))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	stop := rerun.Force(store)
	defer stop()
	const writers, perWriter = 16, 60
	var requests atomic.Int64
	last := make([]string, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			scope := fmt.Sprintf("s%d", i)
			for v := uint64(1); v <= perWriter; v++ {
				body := strings.Repeat(fmt.Sprintf("%s-%d;", scope, v), int(v)%40+20)
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/write/"+scope, strings.NewReader(body))
				req.Header.Set(httpguard.TokenHeader, fence.Token{Scope: scope, Value: v}.String())
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				requests.Add(1)
				if want := fmt.Sprintf("stored %d bytes", len(body)); resp.StatusCode != http.StatusCreated || string(got) != want {
					t.Errorf("%s token %d: answered %s %q, want 201 %q", scope, v, resp.Status, got, want)
					return
				}
				last[i] = body
			}
		})
	}
	wg.Wait()
	stop()

	if again := runs.Load() - requests.Load(); again <= 0 {
		t.Fatalf("%d handler runs for %d requests: none ran again, so the test showed nothing", runs.Load(), requests.Load())
	} else {
		t.Logf("%d handler runs again for %d requests", again, requests.Load())
	}
	store.DB().View(func(tx *bbolt.Tx) error {
		for i, want := range last {
			scope := fmt.Sprintf("s%d", i)
			if got := tx.Bucket(data).Get([]byte(scope)); string(got) != want {
				t.Errorf("%s holds %d bytes %.20q..., want its last write's %d bytes", scope, len(got), got, len(want))
			}
		}
		return nil
	})
	for i := range writers {
		scope := fmt.Sprintf("s%d", i)
		if m, err := store.Highest(scope); err != nil || m.Token != perWriter {
			t.Errorf("%s: mark %+v, %v; want token %d", scope, m, err, perWriter)
		}
	}
}
