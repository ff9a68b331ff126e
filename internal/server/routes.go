package server

import (
	"net/http"
)

// routes adds fenced's plain HTTP endpoints beside the RPC services.
func (s *Server) routes(mux *http.ServeMux) {
	mux.Handle("GET /metrics", s.metrics.handler())
	mux.HandleFunc("GET /healthz", s.serveHealthz)
	mux.HandleFunc("GET /readyz", s.serveReadyz)
	mux.HandleFunc("GET /{$}", s.serveStatus)
	mux.HandleFunc("GET "+statusClusterPath, s.serveStatusCluster)
	mux.HandleFunc("GET "+statusLeasesPath, s.serveStatusLeases)
	mux.HandleFunc("GET "+eventsPath, s.serveEvents)
}

// servedLocally reports whether a request is about this node itself
// (metrics, health, the status page), so that a follower answers it instead
// of forwarding it to the leader.
func servedLocally(r *http.Request) bool {
	switch r.URL.Path {
	case "/metrics", "/healthz", "/readyz", "/", statusClusterPath:
		return true
	}
	return false
}
