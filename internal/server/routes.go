package server

import (
	"net/http"

	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/status"
)

// routes adds fenced's plain HTTP endpoints beside the RPC services.
func (s *Server) routes(mux *http.ServeMux) {
	mux.Handle("GET /metrics", s.metrics.handler())
	mux.HandleFunc("GET /healthz", s.serveHealthz)
	mux.HandleFunc("GET /readyz", s.serveReadyz)
	mux.HandleFunc("GET /{$}", s.status.ServeStatus)
	mux.HandleFunc("GET "+status.ClusterPath, s.status.ServeCluster)
	mux.HandleFunc("GET "+status.LeasesPath, s.status.ServeLeases)
	mux.HandleFunc("GET "+status.EventsPath, s.status.ServeEvents)
	mux.HandleFunc("GET "+keysPath, s.serveKeys)
}

// servedLocally reports whether a request is about this node itself
// (metrics, health, the status page, its view of the cluster) or answered
// from its own replica (the public keys), so that a follower answers it
// instead of forwarding it to the leader.
func servedLocally(r *http.Request) bool {
	switch r.URL.Path {
	case "/metrics", "/healthz", "/readyz", "/", status.ClusterPath, keysPath,
		"/" + fencev1connect.ClusterServiceName + "/Status":
		return true
	}
	return false
}
