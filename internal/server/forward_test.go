package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestForwardFailureIsAConnectError: when a follower cannot reach the
// leader it forwards to, it answers unavailable in the request's own
// protocol, naming the leader, not with a plain-text 503 that a Connect
// or gRPC client cannot parse.
func TestForwardFailureIsAConnectError(t *testing.T) {
	s := startWith(t, func(*Config) {})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing answers there now
	forward := func(contentType, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/fence.v1.LeaseService/Get", strings.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		r = r.WithContext(context.WithValue(r.Context(), leaderKey{}, dead))
		w := httptest.NewRecorder()
		s.proxy.ServeHTTP(w, r)
		return w
	}

	w := forward("application/json", `{"scope":"a"}`)
	var got struct{ Code, Message string }
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got.Code != "unavailable" {
		t.Fatalf("Connect JSON: %d %q (%v); want a Connect error with code unavailable", w.Code, w.Body, err)
	}
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(got.Message, dead) {
		t.Errorf("Connect JSON: %d, message %q; want 503 naming the leader %s", w.Code, got.Message, dead)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Connect JSON: Content-Type %q", ct)
	}

	w = forward("application/grpc", "")
	st := w.Header().Get("Grpc-Status") // a trailers-only answer
	if st == "" {
		st = w.Result().Trailer.Get("Grpc-Status")
	}
	if st != "14" || w.Code != http.StatusOK {
		t.Errorf("gRPC: HTTP %d, grpc-status %q; want 200 with status 14 (unavailable)", w.Code, st)
	}
}

// startClusterNode starts the node id of a cluster on loopback, with a
// Raft address, bootstrapping it without join and joining through join
// otherwise, with edit's changes to its configuration; and closes it at
// the end of the test.
func startClusterNode(t *testing.T, id string, join []string, edit func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NodeID, cfg.DataDir, cfg.Listen, cfg.RaftListen = id, t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	cfg.Bootstrap, cfg.Join = len(join) == 0, join
	cfg.ElectionTimeout = 4 * time.Second // a loaded machine must not move the leadership
	cfg.NoClockFloor = true               // tokens count from 1 (TestTokenFloor has the floor)
	cfg.Logger = slog.New(slog.DiscardHandler)
	edit(&cfg)
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return s
}
