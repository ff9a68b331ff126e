package httpguard_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/guard/internal/txstore"
)

// TestFailedHandlerRollsBack: a handler that writes a row and then answers
// an error status has failed, so its row must not land, while the client
// gets its answer as written. Its token still becomes the scope's highest,
// so an older token is refused after it; its sequence number does not, so
// a retry with the same one is accepted. boltguard's Batched store runs a
// failed handler again on its own, with the same outcome.
func TestFailedHandlerRollsBack(t *testing.T) {
	for _, st := range []txstore.Store{txstore.Bolt(t, false), txstore.Bolt(t, true), txstore.SQLite(t)} {
		t.Run(st.Name, func(t *testing.T) {
			g := guard.New(st.Store, guard.WithStrictSequence(), guard.WithLogger(slog.New(slog.DiscardHandler)))
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := st.Insert(r.Context(), r.PathValue("id")); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				if code, _ := strconv.Atoi(r.FormValue("fail")); code != 0 {
					http.Error(w, "refused after writing", code)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			mux := http.NewServeMux()
			mux.Handle("POST /rows/{id}", mustMiddleware(t, g, "rows", httpguard.WithRepeats())(h))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			post := func(path string, tok, seq uint64) (int, string) {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, srv.URL+path, nil)
				req.Header.Set(httpguard.TokenHeader, fence.Token{Scope: "rows", Value: tok}.String())
				req.Header.Set(httpguard.SequenceHeader, strconv.FormatUint(seq, 10))
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}

			for i, code := range []int{http.StatusUnprocessableEntity, http.StatusInternalServerError} {
				status, body := post("/rows/r1?fail="+strconv.Itoa(code), 5, 1)
				if status != code || body != "refused after writing\n" {
					t.Fatalf("failed handler %d: answered %d %q, want its own %d", i, status, body, code)
				}
				if n := st.Rows(t); n != 0 {
					t.Fatalf("failed handler %d: %d rows committed, want its write rolled back", i, n)
				}
				if m := st.Highest(t, "rows"); m != (guard.Mark{Token: 5}) {
					t.Fatalf("failed handler %d: mark %+v, want token 5 without its sequence", i, m)
				}
			}
			if status, body := post("/rows/old", 4, 1); status != http.StatusConflict {
				t.Fatalf("an older token after the failed handler: %d %q, want 409", status, body)
			}
			if status, body := post("/rows/r1", 5, 1); status != http.StatusCreated {
				t.Fatalf("the retry with the same token and sequence: %d %q, want 201", status, body)
			}
			if n, m := st.Rows(t), st.Highest(t, "rows"); n != 1 || m != (guard.Mark{Token: 5, Seq: 1}) {
				t.Fatalf("after the retry: %d rows, mark %+v; want 1 row and token 5 sequence 1", n, m)
			}
		})
	}
}
