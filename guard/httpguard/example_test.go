package httpguard_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/httpguard"
)

func ExampleMiddleware() {
	g := guard.New(guard.NewMemoryStore(), guard.WithLogger(slog.New(slog.DiscardHandler)))
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv := httptest.NewServer(httpguard.Middleware(g, "orders")(write))
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
