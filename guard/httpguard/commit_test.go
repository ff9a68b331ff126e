package httpguard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/guard/internal/ordersdb"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// TestFailedCommitIsNotAcknowledged: the handler's writes commit with the
// mark after the handler has answered. When that commit fails (here a
// deferred foreign key, which SQLite checks at COMMIT), the client gets a
// 500 problem, not the handler's 201 and its headers; nothing is written,
// and the token is not recorded. A handler whose commit succeeds is
// answered as it wrote.
func TestFailedCommitIsNotAcknowledged(t *testing.T) {
	db, store := ordersdb.Open(t)
	order := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := sqlguard.TxFromContext(r.Context())
		if _, err := tx.Exec("INSERT INTO orders VALUES (?, ?)", r.PathValue("id"), r.FormValue("customer")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Location", "/orders/"+r.PathValue("id"))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created\n")
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", mustMiddleware(t, guard.New(store), "orders")(order))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(id, customer, token string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders/"+id, strings.NewReader("customer="+customer))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(httpguard.TokenHeader, token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	resp, body := post("o1", "nobody", "fence:v1:orders:5")
	if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Location") != "" || strings.Contains(body, "created") {
		t.Fatalf("a write whose commit failed was answered %s, Location %q, %q; want 500 and none of the handler's answer",
			resp.Status, resp.Header.Get("Location"), body)
	}
	if !strings.Contains(body, "FOREIGN KEY") {
		t.Errorf("the problem does not say why the commit failed: %q", body)
	}
	if n := ordersdb.Count(t, db); n != 0 {
		t.Fatalf("%d orders after the failed commit, want none", n)
	}
	if m, err := store.Highest(t.Context(), "orders"); err != nil || m.Token != 0 {
		t.Fatalf("the mark after the failed commit: %+v, %v; want none recorded", m, err)
	}

	resp, body = post("o2", "ada", "fence:v1:orders:5")
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Location") != "/orders/o2" || body != "created\n" {
		t.Fatalf("a committed write was answered %s, Location %q, %q; want the handler's 201", resp.Status, resp.Header.Get("Location"), body)
	}
	if m, err := store.Highest(t.Context(), "orders"); err != nil || m.Token != 5 {
		t.Fatalf("the mark after the committed write: %+v, %v; want token 5", m, err)
	}
}
