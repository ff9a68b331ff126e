package httpguard_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/httpguard"
)

func ExampleMiddleware() {
	g := guard.New(guard.NewMemoryStore(), guard.WithLogger(slog.New(slog.DiscardHandler)))
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	fenced, err := httpguard.Middleware(g, "orders")
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(fenced(write))
	defer srv.Close()

	for _, tok := range []string{"fence:v1:orders:42", "fence:v1:orders:41"} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("x"))
		req.Header.Set("Fencing-Token", tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(tok, "→", resp.StatusCode)
		if len(body) > 0 {
			fmt.Print(string(body))
		}
	}
	// Output:
	// fence:v1:orders:42 → 204
	// fence:v1:orders:41 → 409
	// {"type":"https://fence.dev/problems/stale-token","title":"Stale fencing token","status":409,"detail":"stale fencing token for \"orders\": token 41 was superseded by token 42","scope":"orders","presented_token":41,"highest_token":42}
}

// boltguard's Batched store may run a handler more than once, so
// Middleware accepts it only with WithRepeats, for handlers that change
// nothing but the store's transaction.
func ExampleWithRepeats() {
	dir, err := os.MkdirTemp("", "httpguard")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	store, err := boltguard.Open(filepath.Join(dir, "orders.db"))
	if err != nil {
		panic(err)
	}
	defer store.Close()
	g := guard.New(store.Batched())

	if _, err := httpguard.Middleware(g, "orders"); err != nil {
		fmt.Println("without WithRepeats: refused")
	}
	fenced, err := httpguard.Middleware(g, "orders", httpguard.WithRepeats())
	if err != nil {
		panic(err)
	}
	save := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := boltguard.TxFromContext(r.Context())
		body, _ := io.ReadAll(r.Body) // read afresh by every run
		b, err := tx.CreateBucketIfNotExists([]byte("orders"))
		if err == nil {
			err = b.Put([]byte("7"), body)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(fenced(save))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("2 apples"))
	req.Header.Set(httpguard.TokenHeader, "fence:v1:orders:42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("with WithRepeats:", resp.Status)
	// Output:
	// without WithRepeats: refused
	// with WithRepeats: 204 No Content
}
