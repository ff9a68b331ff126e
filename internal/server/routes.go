package server

import (
	"net/http"
)

// routes adds fenced's plain HTTP endpoints beside the RPC services.
func (s *Server) routes(mux *http.ServeMux) {
	mux.Handle("GET /metrics", s.metrics.handler())
	mux.HandleFunc("GET /healthz", s.serveHealthz)
	mux.HandleFunc("GET /readyz", s.serveReadyz)
}

// servedLocally reports whether a request is about this node itself
// (metrics, health, the status page), so that a follower answers it instead
// of forwarding it to the leader.
func servedLocally(r *http.Request) bool {
	switch r.URL.Path {
	case "/metrics", "/healthz", "/readyz":
		return true
	}
	return false
}
