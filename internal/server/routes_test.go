package server

import (
	"net/http/httptest"
	"testing"

	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/status"
)

// TestPublicPathsAreServedLocally: every path open without an identity
// with auth on is one a follower answers itself. forward relies on it:
// Authenticate lets no other request without an identity through, so
// forward never sends one to the leader over this node's certificate.
func TestPublicPathsAreServedLocally(t *testing.T) {
	public := 0
	for _, p := range []string{"/metrics", "/healthz", "/readyz", "/", status.ClusterPath, status.LeasesPath, status.EventsPath, keysPath,
		"/" + fencev1connect.ClusterServiceName + "/Status", fencev1connect.LeaseServiceGetProcedure} {
		if !publicPath(p) {
			continue
		}
		public++
		if !servedLocally(httptest.NewRequest("GET", p, nil)) {
			t.Errorf("%s is public but not served locally: a follower would forward a request for it without an identity", p)
		}
	}
	if public == 0 {
		t.Error("no path is public: the list above no longer names them")
	}
}
