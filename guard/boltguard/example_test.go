package boltguard_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/httpguard"
)

// A service that keeps its data in bbolt, fenced by httpguard: with the
// Batched store, concurrent requests share one commit. The handler writes
// only through the transaction, because it may run more than once.
func ExampleStore_Batched() {
	dir, _ := os.MkdirTemp("", "boltguard")
	defer os.RemoveAll(dir)
	store, err := boltguard.Open(filepath.Join(dir, "orders.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	save := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := boltguard.TxFromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		b, err := tx.CreateBucketIfNotExists([]byte("orders"))
		if err == nil {
			err = b.Put([]byte(r.PathValue("id")), body)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux := http.NewServeMux()
	// The Batched store may run save more than once, which it allows: it
	// reads the body afresh and changes nothing but tx.
	fenced, err := httpguard.Middleware(guard.New(store.Batched()), "orders", httpguard.WithRepeats())
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("PUT /orders/{id}", fenced(save))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/orders/7", strings.NewReader("2 apples"))
	req.Header.Set(httpguard.TokenHeader, "fence:v1:orders:42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.Status)
	store.DB().View(func(tx *bbolt.Tx) error {
		fmt.Printf("order 7: %s\n", tx.Bucket([]byte("orders")).Get([]byte("7")))
		return nil
	})
	// Output:
	// 204 No Content
	// order 7: 2 apples
}
