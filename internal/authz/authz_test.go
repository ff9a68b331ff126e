package authz

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/testcerts"
)

func writeAuth(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadRefusesBadFiles(t *testing.T) {
	for _, body := range []string{
		`{"rules": [{"identity": "x", "allow": ["acquire", "fly"]}]}`,
		`{"rules": [{"prefix": "a/", "allow": ["get"]}]}`,
		`{"tokens": [{"identity": "x", "sha256": "abc"}]}`,
		`{"rulez": []}`,
	} {
		if _, err := Load(writeAuth(t, body)); err == nil {
			t.Errorf("Load(%s) succeeded, want an error", body)
		}
	}
}

// TestAuthenticate: the identity comes from a bearer token or a client
// certificate, and a forwarded identity is believed only from a node; a
// call a node forwards for no one has no identity, not the node's.
func TestAuthenticate(t *testing.T) {
	sum := sha256.Sum256([]byte("secret"))
	a, err := Load(writeAuth(t, fmt.Sprintf(`{
		"tokens": [{"identity": "svc", "sha256": %q}],
		"nodes": ["n1"],
		"rules": [{"identity": "svc", "prefix": "", "allow": ["status"]}]}`, hex.EncodeToString(sum[:]))))
	if err != nil {
		t.Fatal(err)
	}
	// Nodes' certificates come from the cluster CA, callers' from the
	// client CA; "client:n1" is a client certificate naming a node.
	clusterCA, clientCA := testcerts.NewCA(t, "cluster CA"), testcerts.NewCA(t, "client CA")
	certs := map[string]*x509.Certificate{}
	for _, c := range []struct {
		name string
		ca   *testcerts.CA
		cn   string
	}{{"n1", clusterCA, "n1"}, {"x", clientCA, "x"}, {"client:n1", clientCA, "n1"}} {
		leaf, err := x509.ParseCertificate(c.ca.Issue(t, c.cn).Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		certs[c.name] = leaf
	}
	var got string
	h := a.Authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = Identity(r.Context()) }),
		func(p string) bool { return p == "/healthz" }, clusterCA.Pool())
	// With conn, each call is on a connection of its own that ConnContext
	// set up, as the server's are; without, there is nothing to remember.
	call := func(conn bool, path, cert string, header map[string]string) (int, string) {
		got = ""
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if conn {
			r = r.WithContext(ConnContext(r.Context(), nil))
		}
		if cert != "" {
			r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{certs[cert]}}
		}
		for k, v := range header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, got
	}
	for _, c := range []struct {
		name, path, cert string
		header           map[string]string
		code             int
		id               string
	}{
		{"bearer", "/metrics", "", map[string]string{"Authorization": "Bearer secret"}, 200, "svc"},
		{"wrong bearer", "/metrics", "", map[string]string{"Authorization": "Bearer nope"}, 401, ""},
		{"public path", "/healthz", "", nil, 200, ""},
		{"forwarded by a node", "/fence.v1.LeaseService/Get", "n1", map[string]string{identityHeader: "svc"}, 200, "svc"},
		{"forwarded by a stranger", "/fence.v1.LeaseService/Get", "x", map[string]string{identityHeader: "svc"}, 200, "x"},
		{"a node for itself", "/fence.v1.ClusterService/AddNode", "n1", nil, 200, "n1"},
		// A follower forwarding a caller it could not identify: an RPC
		// without an identity is refused here (Connect unary: 401).
		{"forwarded by a node for no one", "/fence.v1.ClusterService/RotateSigningKey", "n1", map[string]string{ForwardedHeader: "n2"}, 401, ""},
		{"forwarded by a node, a bearer token it did not know", "/fence.v1.LeaseService/Get", "n1", map[string]string{ForwardedHeader: "n2", "Authorization": "Bearer nope"}, 401, ""},
		{"certificate without the rule", "/metrics", "x", nil, 403, ""},
		{"client certificate naming a node", "/fence.v1.LeaseService/Get", "client:n1", map[string]string{identityHeader: "svc"}, 401, ""},
		{"client certificate naming a node, no header", "/metrics", "client:n1", nil, 401, ""},
	} {
		for _, conn := range []bool{false, true} {
			code, id := call(conn, c.path, c.cert, c.header)
			if code != c.code || (code == 200 && id != c.id) {
				t.Errorf("%s (ConnContext %v): %d, identity %q; want %d, %q", c.name, conn, code, id, c.code, c.id)
			}
		}
	}
}

// TestRPCWithoutIdentityIsRefusedUnread: an RPC without an identity is
// answered unauthenticated in its own protocol's form, with the message the
// Interceptor gives, and neither its handler runs nor is a byte of its
// body read; over HTTP/1 its connection is then closed rather than read on.
func TestRPCWithoutIdentityIsRefusedUnread(t *testing.T) {
	a, err := Load(writeAuth(t, `{"rules": []}`))
	if err != nil {
		t.Fatal(err)
	}
	h := a.Authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("%s reached the handler", r.URL.Path)
	}), func(string) bool { return false }, nil)
	const says = "this service needs credentials: a client certificate or a bearer token"
	for _, c := range []struct {
		name, contentType string
		code              int
		in                func(w *httptest.ResponseRecorder) string // where the error is
	}{
		{"Connect, JSON", "application/json", http.StatusUnauthorized, func(w *httptest.ResponseRecorder) string { return w.Body.String() }},
		{"Connect, protobuf", "application/proto", http.StatusUnauthorized, func(w *httptest.ResponseRecorder) string { return w.Body.String() }},
		{"Connect streaming", "application/connect+proto", http.StatusOK, func(w *httptest.ResponseRecorder) string { return w.Body.String() }},
		{"gRPC", "application/grpc", http.StatusOK, func(w *httptest.ResponseRecorder) string {
			return w.Header().Get("Grpc-Status") + " " + w.Header().Get("Grpc-Message")
		}},
	} {
		body := &readCounter{}
		r := httptest.NewRequest(http.MethodPost, fencev1connect.LeaseServiceAcquireBatchProcedure, body)
		r.Header.Set("Content-Type", c.contentType)
		r.Header.Set("Authorization", "Bearer unknown")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		got := c.in(w)
		if c.contentType == "application/grpc" && !strings.HasPrefix(got, "16 ") {
			t.Errorf("%s: grpc-status and message %q; want 16 (unauthenticated)", c.name, got)
		}
		if w.Code != c.code || !strings.Contains(got, says) || c.contentType != "application/grpc" && !strings.Contains(got, `"unauthenticated"`) {
			t.Errorf("%s: %d %q; want %d, unauthenticated, %q", c.name, w.Code, got, c.code, says)
		}
		if body.reads > 0 {
			t.Errorf("%s: the body was read %d times before the refusal", c.name, body.reads)
		}
		if w.Header().Get("Connection") != "close" {
			t.Errorf("%s: over HTTP/1, Connection %q; want close (net/http would read the body left)", c.name, w.Header().Get("Connection"))
		}
	}
	if err := (authorizer{a}).check(context.Background(), fencev1connect.LeaseServiceGetProcedure, &fencev1.GetRequest{Scope: "a"}); connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), says) {
		t.Errorf("the Interceptor without an identity: %v; want unauthenticated, %q", err, says)
	}
}

// readCounter is a request body that counts its reads.
type readCounter struct{ reads int }

func (b *readCounter) Read(p []byte) (int, error) {
	b.reads++
	return copy(p, "x"), nil
}

// TestReportAuthorizesEachScope: a report is authorized rejection by
// rejection, not by the scopes' common prefix; one scope outside the rules
// refuses the whole report and is named; a report of a dropped count only
// needs "report" on some scope.
func TestReportAuthorizesEachScope(t *testing.T) {
	a, err := Load(writeAuth(t, `{"rules": [
		{"identity": "guard", "prefix": "orders/", "allow": ["report"]},
		{"identity": "guard", "prefix": "billing/", "allow": ["report"]},
		{"identity": "reader", "prefix": "", "allow": ["get"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	report := func(dropped uint64, scopes ...string) *fencev1.ReportRejectionsRequest {
		m := &fencev1.ReportRejectionsRequest{Guard: "db", Dropped: dropped}
		for _, s := range scopes {
			m.Rejections = append(m.Rejections, &fencev1.Rejection{Scope: s, PresentedToken: 1, HighestToken: 2})
		}
		return m
	}
	for _, c := range []struct {
		name string
		id   string
		msg  *fencev1.ReportRejectionsRequest
		says string // "" for allowed
	}{
		{"both prefixes", "guard", report(0, "orders/1", "billing/2", "orders/3"), ""},
		{"one prefix", "guard", report(0, "orders/1"), ""},
		{"one scope outside", "guard", report(0, "orders/1", "hr/7", "billing/2"), `"guard" may not report "hr/7"`},
		{"dropped only, a reporter", "guard", report(5), ""},
		{"dropped only, not a reporter", "reader", report(5), `"reader" may not report on any scope`},
		{"a scope, not a reporter", "reader", report(0, "orders/1"), `"reader" may not report "orders/1"`},
	} {
		ctx := context.WithValue(context.Background(), identityKey{}, c.id)
		err := authorizer{a}.check(ctx, fencev1connect.LeaseServiceReportRejectionsProcedure, c.msg)
		switch {
		case c.says == "" && err != nil:
			t.Errorf("%s: %v; want allowed", c.name, err)
		case c.says != "" && (connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), c.says)):
			t.Errorf("%s: %v; want permission_denied, %s", c.name, err, c.says)
		}
	}
}
