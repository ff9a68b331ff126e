package httpguard_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/httpguard"
)

// guarded is Middleware for the scope "orders" over a MemoryStore, in front
// of a handler that counts its calls.
type guarded struct {
	h     http.Handler
	store *guard.MemoryStore
	calls int
}

func newGuarded(t testing.TB) *guarded {
	gd := &guarded{store: guard.NewMemoryStore()}
	g := guard.New(gd.store, guard.WithLogger(slog.New(slog.DiscardHandler)))
	gd.h = mustMiddleware(t, g, "orders")(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gd.calls++
		w.WriteHeader(http.StatusNoContent)
	}))
	return gd
}

// headers are the values of the token and sequence headers of a request;
// nil leaves a header out.
type headers struct{ token, seq []string }

func (h headers) set(r *http.Request) {
	if h.token != nil {
		r.Header[httpguard.TokenHeader] = h.token
	}
	if h.seq != nil {
		r.Header[httpguard.SequenceHeader] = h.seq
	}
}

func one(v string) []string { return []string{v} }

// TestHostileHeaders sends hostile Fencing-Token and Fencing-Sequence
// headers through a real HTTP server. Each malformed or foreign one gets
// 400 with a problem+json body naming what is wrong, the handler does not
// run and the mark does not move; tokens beyond float64's exact integers
// are ordered exactly.
func TestHostileHeaders(t *testing.T) {
	gd := newGuarded(t)
	srv := httptest.NewServer(gd.h)
	t.Cleanup(srv.Close)
	send := func(t *testing.T, h headers) (int, httpguard.Problem) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		h.set(req)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p httpguard.Problem
		if resp.StatusCode >= 400 {
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("status %d with Content-Type %q", resp.StatusCode, ct)
			}
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, p
	}
	if code, p := send(t, headers{one("fence:v1:orders:5"), one("3")}); code != http.StatusNoContent {
		t.Fatalf("token 5 sequence 3: %d %+v", code, p)
	}
	tok := func(v string) []string { return one("fence:v1:orders:" + v) }
	for _, tc := range []struct {
		name string
		h    headers
		says string // in the problem's detail
	}{
		{"no token", headers{}, "missing Fencing-Token header"},
		{"empty token", headers{token: one("")}, `must start with "fence:"`},
		{"a bare number", headers{token: one("9")}, `must start with "fence:"`},
		{"token 0", headers{token: tok("0")}, "from 1 to 9223372036854775807"},
		{"negative token", headers{token: tok("-9")}, "from 1 to 9223372036854775807"},
		{"token 1e309", headers{token: tok("1e309")}, "not a decimal integer"},
		{"leading zeros", headers{token: tok("009")}, "without leading zeros"},
		{"a plus sign", headers{token: tok("+9")}, "not a decimal integer"},
		{"token 2^63", headers{token: tok("9223372036854775808")}, "above the maximum"},
		{"token 2^64", headers{token: tok("18446744073709551616")}, "above the maximum"},
		{"a hex token", headers{token: tok("0x9")}, "not a decimal integer"},
		{"another scope", headers{token: one("fence:v1:billing:9")}, "another scope"},
		{"another scope by case", headers{token: one("fence:v1:Orders:9")}, "another scope"},
		{"a ../ scope", headers{token: one("fence:v1:orders/../billing:9")}, `".." segment`},
		{"an unknown version", headers{token: one("fence:v9:orders:9")}, "version"},
		{"two tokens", headers{token: []string{"fence:v1:orders:9", "fence:v1:orders:10"}}, "want exactly one"},
		{"sequence 0", headers{tok("9"), one("0")}, "from 1 to 18446744073709551615"},
		{"negative sequence", headers{tok("9"), one("-1")}, "from 1 to 18446744073709551615"},
		{"sequence 2^64", headers{tok("9"), one("18446744073709551616")}, "from 1 to 18446744073709551615"},
		{"sequence 1e3", headers{tok("9"), one("1e3")}, "from 1 to 18446744073709551615"},
		{"two sequences", headers{tok("9"), []string{"9", "1"}}, "want at most one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, calls := gd.store.Highest("orders"), gd.calls
			code, p := send(t, tc.h)
			if code != http.StatusBadRequest || !strings.Contains(p.Detail, tc.says) {
				t.Errorf("status %d, detail %q; want 400 saying %q", code, p.Detail, tc.says)
			}
			if gd.calls != calls {
				t.Error("the handler ran")
			}
			if after := gd.store.Highest("orders"); after != before {
				t.Errorf("the mark moved from %+v to %+v", before, after)
			}
		})
	}
	// Beyond float64: 2^53+1 and 2^53 are one double; 2^63-1 and 2^63-2 too.
	for _, c := range []struct{ newer, older uint64 }{{1<<53 + 1, 1 << 53}, {fence.MaxToken, fence.MaxToken - 1}} {
		if code, p := send(t, headers{token: tok(strconv.FormatUint(c.newer, 10))}); code != http.StatusNoContent {
			t.Fatalf("token %d: %d %+v", c.newer, code, p)
		}
		code, p := send(t, headers{token: tok(strconv.FormatUint(c.older, 10))})
		if code != http.StatusConflict || p.PresentedToken != c.older || p.HighestToken != c.newer {
			t.Errorf("token %d after %d: %d %+v; want 409 with both exactly", c.older, c.newer, code, p)
		}
		if m := gd.store.Highest("orders"); m.Token != c.newer {
			t.Errorf("mark %d, want %d", m.Token, c.newer)
		}
	}
}

// FuzzHeaders fuzzes the Fencing-Token and Fencing-Sequence headers of a
// request to the middleware (a value list each, split at \x1e; seqSet
// false leaves the sequence header out). The answer must agree with the
// rule: 400 for anything but one well-formed token of the scope and at
// most one sequence from 1 to 2^64-1, else 409 if guard.Check calls it
// stale, else the handler runs and the mark becomes guard.Next. Never a
// 5xx; the mark moves only when the handler ran.
func FuzzHeaders(f *testing.F) {
	for _, s := range []struct {
		token, seq string
		seqSet     bool
	}{
		{"fence:v1:orders:6", "", false},
		{"fence:v1:orders:5", "4", true},
		{"fence:v1:orders:5", "3", true},
		{"fence:v1:orders:4", "9", true},
		{"fence:v1:orders:9007199254740993", "18446744073709551615", true},
		{"fence:v1:orders:9223372036854775807", "", false},
		{"fence:v1:orders:007", "", false},
		{"fence:v1:orders:1e309", "", false},
		{"fence:v1:billing:9", "", false},
		{"fence:v1:orders:9\x1efence:v1:orders:10", "", false},
		{"fence:v1:orders:9", "9\x1e1", true},
		{"fence:v1:orders:9", "", true},
		{"fence:v1:orders:9 ", "+1", true},
		{"fence:v1:orders\x00:9", "0x1", true},
		{"fence:v2:orders:9:00000000000000000000000000000001:k:AAAA", "", false},
	} {
		f.Add(s.token, s.seq, s.seqSet)
	}
	f.Fuzz(func(t *testing.T, token, seq string, seqSet bool) {
		gd := newGuarded(t)
		start := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		headers{one("fence:v1:orders:5"), one("3")}.set(req)
		if gd.h.ServeHTTP(start, req); start.Code != http.StatusNoContent {
			t.Fatalf("setting the mark: %d", start.Code)
		}
		h := headers{token: strings.Split(token, "\x1e")}
		if seqSet {
			h.seq = strings.Split(seq, "\x1e")
		}
		before := gd.store.Highest("orders")
		rec := httptest.NewRecorder()
		req = httptest.NewRequest(http.MethodPost, "/", nil)
		h.set(req)
		gd.h.ServeHTTP(rec, req)
		after := gd.store.Highest("orders")

		want, w := expected(h, before)
		if rec.Code != want {
			t.Fatalf("headers %q: status %d (%s), want %d", h, rec.Code, rec.Body, want)
		}
		ran := gd.calls == 2
		switch {
		case ran != (want == http.StatusNoContent):
			t.Fatalf("headers %q: status %d but the handler ran: %v", h, rec.Code, ran)
		case ran && after != guard.Next(before, w):
			t.Fatalf("headers %q: mark %+v after %+v, want %+v", h, after, before, guard.Next(before, w))
		case !ran && after != before:
			t.Fatalf("headers %q: refused, but the mark moved from %+v to %+v", h, before, after)
		case !ran && rec.Header().Get("Content-Type") != "application/problem+json":
			t.Fatalf("headers %q: refused without a problem+json body", h)
		}
	})
}

// expected is what the middleware must answer to h when the mark is
// highest, and the write it must record when it accepts.
func expected(h headers, highest guard.Mark) (int, guard.Write) {
	if len(h.token) != 1 {
		return http.StatusBadRequest, guard.Write{}
	}
	tok, err := fence.ParseToken(h.token[0])
	if err != nil || tok.Scope != "orders" {
		return http.StatusBadRequest, guard.Write{}
	}
	w := guard.Write{Token: tok}
	switch {
	case len(h.seq) > 1:
		return http.StatusBadRequest, guard.Write{}
	case len(h.seq) == 1 && h.seq[0] != "":
		n, err := strconv.ParseUint(h.seq[0], 10, 64)
		if err != nil || n == 0 {
			return http.StatusBadRequest, guard.Write{}
		}
		w.Seq = n
	}
	if guard.Check("orders", highest, w, false) != nil {
		return http.StatusConflict, w
	}
	return http.StatusNoContent, w
}
