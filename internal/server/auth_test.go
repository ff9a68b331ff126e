package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/testcerts"
)

// TestAuthorizationMatrix calls every RPC with no credentials, with a
// certificate from another CA, with an identity whose rules do not cover
// the scope (or the cluster), and with valid credentials (a certificate,
// then a bearer token), and checks each answer's exact code.
func TestAuthorizationMatrix(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "fence test CA")
	srvCert, srvKey := testcerts.Write(t, dir, "server", ca.Issue(t, "n1"))
	s := startWith(t, func(cfg *Config) {
		cfg.TLS = TLS{Cert: srvCert, Key: srvKey, ClientCA: ca.WriteCA(t, dir, "ca")}
		cfg.AuthFile = writeMatrixAuth(t, dir, "n1")
	})
	checkAuthorizationMatrix(t, s.Addr(), ca.Pool(), ca, false)
}

// TestAuthorizationMatrixThroughAFollower runs the matrix of
// TestAuthorizationMatrix through a follower of a three-node cluster with
// TLS, an auth file, and a CA for the nodes apart from the clients': every
// call is forwarded to the leader over the follower's node certificate, and
// every answer must be the one the leader gives a caller on its own. A
// follower once forwarded a call without credentials stripped of any
// identity, and the leader took it for the node's own: anyone could rotate
// the signing key, remove a node or hold leases as the node. A client
// certificate naming a node is no one there either. Then, at the leader,
// a node's certificate on a call it says it forwards, naming no one, is
// anonymous, not the node.
func TestAuthorizationMatrixThroughAFollower(t *testing.T) {
	dir := t.TempDir()
	clusterCA, clientCA := testcerts.NewCA(t, "cluster CA"), testcerts.NewCA(t, "client CA")
	nodes := startTLSCluster(t, dir, clusterCA, clientCA, writeMatrixAuth(t, dir, "n1", "n2", "n3"), "n1", "n2", "n3")
	leader, follower := nodes[0], nodes[1]
	checkAuthorizationMatrix(t, follower.Addr(), clusterCA.Pool(), clientCA, true)

	for _, to := range []*Server{leader, follower} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: clusterCA.Pool(), Certificates: []tls.Certificate{clusterCA.Issue(t, "n3")}}, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP2(true)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req := connect.NewRequest(&fencev1.RotateSigningKeyRequest{})
		req.Header().Set(forwardedHeader, "n3")
		_, err := fencev1connect.NewClusterServiceClient(&http.Client{Transport: tr}, "https://"+to.Addr()).RotateSigningKey(ctx, req)
		cancel()
		tr.CloseIdleConnections()
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("node n3's certificate forwarding for no one to %s: %v; want %v", to.cfg.NodeID, err, connect.CodeUnauthenticated)
		}
	}
}

// writeMatrixAuth writes the auth file of the authorization matrix, with
// nodes as the cluster's nodes.
func writeMatrixAuth(t *testing.T, dir string, nodes ...string) string {
	t.Helper()
	sum := sha256.Sum256([]byte("orders-secret"))
	listed, err := json.Marshal(nodes)
	if err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(authFile, fmt.Appendf(nil, `{
		"tokens": [{"identity": "orders-svc", "sha256": %q}],
		"nodes": %s,
		"rules": [
			{"identity": "orders-svc", "prefix": "orders/", "allow": ["acquire", "renew", "release", "get", "list", "watch", "report"]},
			{"identity": "admin", "prefix": "", "allow": ["cluster"]}
		]}`, hex.EncodeToString(sum[:]), listed), 0o600); err != nil {
		t.Fatal(err)
	}
	return authFile
}

// startTLSCluster starts a cluster of the nodes ids over TLS, each with a
// certificate of clusterCA naming it, clients' certificates signed by
// clientCA, and the auth file authFile; the first bootstraps, the others
// join through it. It returns them, the first leading, once every
// follower is ready, and closes them at the end of the test.
func startTLSCluster(t *testing.T, dir string, clusterCA, clientCA *testcerts.CA, authFile string, ids ...string) []*Server {
	t.Helper()
	clusterFile, clientFile := clusterCA.WriteCA(t, dir, "cluster-ca"), clientCA.WriteCA(t, dir, "client-ca")
	var nodes []*Server
	for _, id := range ids {
		var join []string
		if len(nodes) > 0 {
			join = []string{nodes[0].Addr()}
		}
		cert, key := testcerts.Write(t, dir, id, clusterCA.Issue(t, id))
		nodes = append(nodes, startClusterNode(t, id, join, func(cfg *Config) {
			cfg.TLS = TLS{Cert: cert, Key: key, ClientCA: clientFile, CA: clusterFile}
			cfg.AuthFile = authFile
		}))
	}
	waitFor(t, "the cluster is ready", func() bool {
		return nodes[0].Ready() && !slices.ContainsFunc(nodes, func(s *Server) bool { ok, _ := s.readiness(); return !ok })
	})
	return nodes
}

// checkAuthorizationMatrix runs the authorization matrix against the node
// at addr, whose certificate roots verifies; clients' certificates come
// from clients. With nodeCA, the nodes have a CA of their own, and a client
// certificate naming a node must get no identity.
func checkAuthorizationMatrix(t *testing.T, addr string, roots *x509.CertPool, clients *testcerts.CA, nodeCA bool) {
	t.Helper()
	ca, rogue := clients, testcerts.NewCA(t, "rogue CA")
	clientFor := func(certs []tls.Certificate, bearer string) (fencev1connect.LeaseServiceClient, fencev1connect.ClusterServiceClient) {
		tc := &tls.Config{RootCAs: roots}
		if len(certs) > 0 {
			// Sent even when the server names other CAs as acceptable,
			// which Go's client would otherwise take as a reason to send
			// none, calling without credentials instead.
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
		}
		tr := &http.Transport{TLSClientConfig: tc, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP2(true)
		h := &http.Client{Transport: tr}
		var opts []connect.ClientOption
		if bearer != "" {
			opts = append(opts, connect.WithInterceptors(testBearer("Bearer "+bearer)))
		}
		base := "https://" + addr
		return fencev1connect.NewLeaseServiceClient(h, base, opts...), fencev1connect.NewClusterServiceClient(h, base, opts...)
	}

	// handshake stands for "refused at the TLS handshake": no connect code.
	const handshake connect.Code = 1000
	type creds struct {
		name    string
		certs   []tls.Certificate
		bearer  string
		admin   []tls.Certificate // for the cluster RPCs
		scope   string
		want    connect.Code // for every lease RPC; 0 = the valid answers below
		cluster connect.Code
	}
	orders, adminCert := ca.Issue(t, "orders-svc"), ca.Issue(t, "admin")
	rows := []creds{
		{name: "no credentials", scope: "orders/1", want: connect.CodeUnauthenticated, cluster: connect.CodeUnauthenticated},
		{name: "wrong CA", certs: []tls.Certificate{rogue.Issue(t, "orders-svc")}, admin: []tls.Certificate{rogue.Issue(t, "admin")}, scope: "orders/1", want: handshake, cluster: handshake},
		{name: "wrong prefix", certs: []tls.Certificate{orders}, admin: []tls.Certificate{orders}, scope: "billing/1", want: connect.CodePermissionDenied, cluster: connect.CodePermissionDenied},
		{name: "unknown bearer token", bearer: "guess", scope: "orders/1", want: connect.CodeUnauthenticated, cluster: connect.CodeUnauthenticated},
		{name: "valid certificate", certs: []tls.Certificate{orders}, admin: []tls.Certificate{adminCert}, scope: "orders/1"},
		{name: "valid bearer token", bearer: "orders-secret", admin: []tls.Certificate{adminCert}, scope: "orders/2"},
	}
	if nodeCA {
		posing := ca.Issue(t, "n1")
		rows = append(rows, creds{name: "client certificate naming a node", certs: []tls.Certificate{posing}, admin: []tls.Certificate{posing},
			scope: "orders/1", want: connect.CodeUnauthenticated, cluster: connect.CodeUnauthenticated})
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			lease, _ := clientFor(row.certs, row.bearer)
			_, cluster := clientFor(row.admin, "")
			if row.admin == nil {
				_, cluster = clientFor(nil, row.bearer)
			}
			check := func(rpc string, err error, want connect.Code) {
				t.Helper()
				switch {
				case want == handshake:
					// No answer from fenced: the handshake fails, or under
					// TLS 1.3 the request written meanwhile does, or a later
					// call finds that the connection could not be made.
					if c := connect.CodeOf(err); err == nil || c != connect.CodeUnavailable && c != connect.CodeCanceled && c != connect.CodeUnknown || strings.Contains(err.Error(), "lease service") {
						t.Errorf("%s: %v; want the TLS handshake to refuse the certificate", rpc, err)
					}
				case connect.CodeOf(err) != want && !(want == 0 && err == nil):
					t.Errorf("%s: %v; want %v", rpc, err, want)
				}
			}
			valid := row.want == 0 && row.cluster == 0

			watch, err := lease.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: row.scope}))
			if err != nil {
				t.Fatal(err)
			}
			acq, err := lease.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: row.scope, Holder: "h"}))
			check("Acquire", err, row.want)
			id := "0123456789abcdef0123456789abcdef"
			if err == nil {
				id = acq.Msg.Lease.LeaseId
			}
			_, err = lease.Renew(ctx, connect.NewRequest(&fencev1.RenewRequest{Scope: row.scope, LeaseId: id}))
			check("Renew", err, row.want)
			// checkBatch: a batch call with credentials answers a scope
			// outside the rules in that item's result, not for the call.
			checkBatch := func(rpc string, err error, want connect.Code, failure func() *fencev1.RenewFailure) {
				t.Helper()
				if want != connect.CodePermissionDenied {
					check(rpc, err, want)
					return
				}
				if err != nil {
					t.Errorf("%s: %v; want the call answered and its item refused", rpc, err)
					return
				}
				if f := failure(); f.GetCode() != "permission_denied" {
					t.Errorf("%s: %v; want its item refused with permission_denied", rpc, f)
				}
			}
			batch, err := lease.RenewBatch(ctx, connect.NewRequest(&fencev1.RenewBatchRequest{Renewals: []*fencev1.RenewRequest{{Scope: row.scope, LeaseId: id}}}))
			checkBatch("RenewBatch", err, row.want, func() *fencev1.RenewFailure { return firstFailure(batch.Msg.Results) })
			if valid && (len(batch.Msg.Results) != 1 || batch.Msg.Results[0].ExpiresIn.AsDuration() <= 0) {
				t.Errorf("RenewBatch: %v; want the lease renewed", batch.Msg)
			}
			// Beside row.scope, not under it: List and Watch below see it alone.
			other := strings.Replace(row.scope, "/", "/batch-", 1)
			acqs, err := lease.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{Acquires: []*fencev1.AcquireRequest{{Scope: other, Holder: "h"}}}))
			checkBatch("AcquireBatch", err, row.want, func() *fencev1.RenewFailure { return firstFailure(acqs.Msg.Results) })
			otherID := id
			if err == nil && len(acqs.Msg.Results) == 1 && acqs.Msg.Results[0].Lease != nil {
				otherID = acqs.Msg.Results[0].Lease.LeaseId
			} else if valid {
				t.Errorf("AcquireBatch: %v, %v; want a grant", acqs, err)
			}
			rels, err := lease.ReleaseBatch(ctx, connect.NewRequest(&fencev1.ReleaseBatchRequest{Releases: []*fencev1.ReleaseRequest{{Scope: other, LeaseId: otherID}}}))
			checkBatch("ReleaseBatch", err, row.want, func() *fencev1.RenewFailure { return firstFailure(rels.Msg.Results) })
			if valid {
				// Each item of a batch is authorized on its own: the one
				// outside the rules is refused, the others are done.
				batch, err := lease.RenewBatch(ctx, connect.NewRequest(&fencev1.RenewBatchRequest{Renewals: []*fencev1.RenewRequest{{Scope: row.scope, LeaseId: id}, {Scope: "billing/1", LeaseId: id}}}))
				if err != nil || batch.Msg.Results[0].Failure != nil || batch.Msg.Results[1].GetFailure().GetCode() != "permission_denied" {
					t.Errorf("RenewBatch with a scope outside the rules: %v, %v; want the first renewed, the second permission_denied", batch.Msg, err)
				}
				acqs, err := lease.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{Acquires: []*fencev1.AcquireRequest{{Scope: "billing/1", Holder: "h"}, {Scope: other + "c", Holder: "h"}}}))
				if err != nil || acqs.Msg.Results[0].GetFailure().GetCode() != "permission_denied" || acqs.Msg.Results[1].GetLease().GetToken() == 0 {
					t.Fatalf("AcquireBatch with a scope outside the rules: %v, %v; want the first permission_denied, the second granted", acqs.Msg, err)
				}
				got := acqs.Msg.Results[1].Lease
				rels, err := lease.ReleaseBatch(ctx, connect.NewRequest(&fencev1.ReleaseBatchRequest{Releases: []*fencev1.ReleaseRequest{{Scope: got.Scope, LeaseId: got.LeaseId}, {Scope: "billing/1", LeaseId: got.LeaseId}}}))
				if err != nil || rels.Msg.Results[0].Token != got.Token || rels.Msg.Results[1].GetFailure().GetCode() != "permission_denied" {
					t.Errorf("ReleaseBatch with a scope outside the rules: %v, %v; want the first released, the second permission_denied", rels.Msg, err)
				}
			}
			_, err = lease.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: row.scope}))
			check("Get", err, row.want)
			list, err := lease.List(ctx, connect.NewRequest(&fencev1.ListRequest{Prefix: row.scope}))
			check("List", err, row.want)
			if valid && len(list.Msg.Leases) != 1 {
				t.Errorf("List: %d leases, want the one just acquired", len(list.Msg.Leases))
			}
			if watch.Receive() {
				if !valid {
					t.Errorf("Watch: an unauthorized watcher received %v", watch.Msg())
				}
			} else {
				check("Watch", watch.Err(), row.want)
				if valid {
					t.Errorf("Watch: %v; want the grant's event", watch.Err())
				}
			}
			watch.Close()
			_, err = lease.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: row.scope, LeaseId: id}))
			check("Release", err, row.want)
			_, err = lease.ReportRejections(ctx, connect.NewRequest(&fencev1.ReportRejectionsRequest{Guard: "test",
				Rejections: []*fencev1.Rejection{{Scope: row.scope, PresentedToken: 1, HighestToken: 2}, {Scope: row.scope + "0", PresentedToken: 1, HighestToken: 2}}}))
			check("ReportRejections", err, row.want)

			_, err = cluster.Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
			check("Status", err, row.cluster)
			_, err = cluster.RotateSigningKey(ctx, connect.NewRequest(&fencev1.RotateSigningKeyRequest{}))
			check("RotateSigningKey", err, row.cluster)
			// A backup holds every lease ID and signing key: "cluster" only.
			if backup, err := cluster.Backup(ctx, connect.NewRequest(&fencev1.BackupRequest{})); err != nil {
				check("Backup", err, row.cluster)
			} else {
				got := 0
				for backup.Receive() {
					got += len(backup.Msg().Chunk)
				}
				check("Backup", backup.Err(), row.cluster)
				if row.cluster != 0 && got > 0 {
					t.Errorf("Backup: an unauthorized caller received %d bytes of the lease state", got)
				}
				backup.Close()
			}
			// Past authorization, these two fail validation: adding or
			// removing a real member would change the test's cluster.
			want := row.cluster
			if want == 0 {
				want = connect.CodeInvalidArgument
			}
			_, err = cluster.AddNode(ctx, connect.NewRequest(&fencev1.AddNodeRequest{Id: "bad id", RaftAddr: "127.0.0.1:1", ApiAddr: "127.0.0.1:2"}))
			check("AddNode", err, want)
			_, err = cluster.RemoveNode(ctx, connect.NewRequest(&fencev1.RemoveNodeRequest{Id: "n9"}))
			check("RemoveNode", err, want)
		})
	}

	// With auth on, the status endpoints need an identity too; the health
	// checks and public keys do not.
	for path, want := range map[string]int{"/metrics": http.StatusUnauthorized, "/healthz": http.StatusOK, "/keys": http.StatusOK} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
		resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s without credentials: %s, want %d", path, resp.Status, want)
		}
	}
}

type testBearer string

func (b testBearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b testBearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (testBearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// firstFailure returns the failure of a batch answer's first item, nil if
// it has no item.
func firstFailure[R interface{ GetFailure() *fencev1.RenewFailure }](rs []R) *fencev1.RenewFailure {
	if len(rs) == 0 {
		return nil
	}
	return rs[0].GetFailure()
}

// TestClientCertificateIsNoNode calls ClusterService/RotateSigningKey over
// mutual TLS with a client certificate whose common name is a node's,
// vouching for another identity as a forwarding node would. With a cluster
// CA of its own (--tls-ca) only that CA's certificates are nodes, so the
// call has no identity at all; a node's certificate still forwards. With
// one CA for both, every certificate it issues naming a node is that node,
// and fenced warns at start.
func TestClientCertificateIsNoNode(t *testing.T) {
	for _, single := range []bool{false, true} {
		t.Run(map[bool]string{false: "separate CAs", true: "one CA"}[single], func(t *testing.T) {
			dir := t.TempDir()
			clusterCA, clientCA := testcerts.NewCA(t, "cluster CA"), testcerts.NewCA(t, "client CA")
			if single {
				clientCA = clusterCA
			}
			srvCert, srvKey := testcerts.Write(t, dir, "n1", clusterCA.Issue(t, "n1"))
			authFile := filepath.Join(dir, "auth.json")
			os.WriteFile(authFile, []byte(`{"nodes": ["n1"], "rules": [{"identity": "admin", "prefix": "", "allow": ["cluster"]}]}`), 0o600)
			var logs lockedLog
			s := startWith(t, func(cfg *Config) {
				cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				cfg.TLS = TLS{Cert: srvCert, Key: srvKey, ClientCA: clientCA.WriteCA(t, dir, "client-ca")}
				if !single {
					cfg.TLS.CA = clusterCA.WriteCA(t, dir, "cluster-ca")
				}
				cfg.AuthFile = authFile
			})
			rotate := func(cert tls.Certificate, vouch string) error {
				tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: clusterCA.Pool(), Certificates: []tls.Certificate{cert}}, Protocols: new(http.Protocols)}
				tr.Protocols.SetHTTP2(true)
				defer tr.CloseIdleConnections()
				req := connect.NewRequest(&fencev1.RotateSigningKeyRequest{})
				if vouch != "" {
					req.Header().Set("Fence-Identity", vouch)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, err := fencev1connect.NewClusterServiceClient(&http.Client{Transport: tr}, "https://"+s.Addr()).RotateSigningKey(ctx, req)
				return err
			}
			posing := clientCA.Issue(t, "n1")
			for _, vouch := range []string{"anyone", "admin", ""} {
				err := rotate(posing, vouch)
				if single {
					// One CA: this certificate is node n1, as documented.
					if vouch == "anyone" && connect.CodeOf(err) != connect.CodePermissionDenied || vouch != "anyone" && err != nil {
						t.Errorf("one CA, certificate naming n1, vouching for %q: %v", vouch, err)
					}
					continue
				}
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("client certificate naming n1, vouching for %q: %v; want %v", vouch, err, connect.CodeUnauthenticated)
				}
			}
			if err := rotate(clusterCA.Issue(t, "n1"), "admin"); err != nil {
				t.Errorf("node n1 forwarding for admin: %v", err)
			}
			if err := rotate(clientCA.Issue(t, "admin"), ""); err != nil {
				t.Errorf("admin's own certificate: %v", err)
			}
			if warned := strings.Contains(logs.String(), "any certificate it issues naming a node is that node"); warned != single {
				t.Errorf("warned of one CA: %v, want %v; log:\n%s", warned, single, logs.String())
			}
		})
	}
}

// lockedLog is a log that many goroutines may write while a test reads it.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRequestIDIsBoundToTheIdentity: with auth on, a request ID is bound
// to the identity that used it, not to the holder name, which anyone may
// read. Mallory, allowed to acquire the same scopes, presents Alice's
// request ID with Alice's holder name: she was once answered with Alice's
// grant, lease ID and signed token included. Now her acquire is her own,
// answered as one with a request ID never used, under Alice's holder name
// or another: she learns neither Alice's lease ID nor that Alice used the
// ID. Alice's own retry still gets her grant.
func TestRequestIDIsBoundToTheIdentity(t *testing.T) {
	dir := t.TempDir()
	alice, mallory := sha256.Sum256([]byte("alice-secret")), sha256.Sum256([]byte("mallory-secret"))
	authFile := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(authFile, fmt.Appendf(nil, `{
		"tokens": [{"identity": "alice", "sha256": %q}, {"identity": "mallory", "sha256": %q}],
		"rules": [
			{"identity": "alice", "prefix": "jobs/", "allow": ["acquire", "release"]},
			{"identity": "mallory", "prefix": "jobs/", "allow": ["acquire", "release"]}
		]}`, hex.EncodeToString(alice[:]), hex.EncodeToString(mallory[:])), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startWith(t, func(cfg *Config) { cfg.AuthFile = authFile })
	as := func(bearer string) fencev1connect.LeaseServiceClient {
		return fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr(), connect.WithInterceptors(testBearer("Bearer "+bearer)))
	}
	a, m := as("alice-secret"), as("mallory-secret")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acquire := func(c fencev1connect.LeaseServiceClient, holder, requestID string) (*fencev1.Lease, error) {
		resp, err := c.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "jobs/1", Holder: holder, RequestId: requestID}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Lease, nil
	}

	la, err := acquire(a, "worker", "nightly")
	if err != nil {
		t.Fatal(err)
	}
	for _, holder := range []string{"worker", "mallory"} {
		for _, id := range []string{"nightly", "never-used"} {
			l, err := acquire(m, holder, id)
			if connect.CodeOf(err) != connect.CodeAborted || l != nil || strings.Contains(fmt.Sprint(err), la.LeaseId) {
				t.Errorf("Mallory as holder %q with request ID %q: %v, %v; want held (aborted), as with any request ID, and no lease", holder, id, l, err)
			}
		}
	}
	again, err := acquire(a, "worker", "nightly")
	if err != nil || again.LeaseId != la.LeaseId || again.Token != la.Token {
		t.Errorf("Alice's retry: %v, %v; want her grant, token %d", again, err, la.Token)
	}
}

// TestOnlyANodeMovesItself: with auth on, a member's addresses change only
// when that node asks, authenticated as itself (as it does when it rejoins
// after a move), or when an operator allowed "cluster" asks to replace it;
// neither another node (replace or not) nor an operator without replace
// may point them elsewhere, directly or through a follower.
func TestOnlyANodeMovesItself(t *testing.T) {
	dir := t.TempDir()
	clusterCA, clientCA := testcerts.NewCA(t, "cluster CA"), testcerts.NewCA(t, "client CA")
	nodes := startTLSCluster(t, dir, clusterCA, clientCA, writeMatrixAuth(t, dir, "n1", "n2", "n3"), "n1", "n2", "n3")
	addNode := func(to *Server, cert tls.Certificate, id, api string, replace ...bool) error {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: clusterCA.Pool(), Certificates: []tls.Certificate{cert}}, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP2(true)
		defer tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var raftAddr string
		for _, n := range nodes {
			if n.cfg.NodeID == id {
				raftAddr = n.node.RaftAddr()
			}
		}
		_, err := fencev1connect.NewClusterServiceClient(&http.Client{Transport: tr}, "https://"+to.Addr()).AddNode(ctx,
			connect.NewRequest(&fencev1.AddNodeRequest{Id: id, RaftAddr: raftAddr, ApiAddr: api, Replace: len(replace) > 0 && replace[0]}))
		return err
	}
	// recorded reads the leader's record: the one an accepted AddNode was
	// applied on before it answered. n1 leads from the start, but a busy
	// machine can move the lead, and a follower's state may trail.
	recorded := func(id string) string {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			for _, n := range nodes {
				if n.node.IsLeader() {
					var api string
					n.node.Read(func(st *fsm.State) { api = st.Nodes()[id] })
					return api
				}
			}
		}
		t.Fatal("no leader within 10s")
		return ""
	}
	leader, follower := nodes[0], nodes[2]
	for _, by := range []struct {
		name string
		cert tls.Certificate
	}{{"node n3", clusterCA.Issue(t, "n3")}, {"operator admin", clientCA.Issue(t, "admin")}} {
		for _, to := range []*Server{leader, follower} {
			for _, id := range []string{"n1", "n2"} {
				before := recorded(id)
				err := addNode(to, by.cert, id, "127.0.0.1:9")
				if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "only that node changes them") {
					t.Errorf("%s moving %s's API address, at %s: %v; want invalid_argument, only that node", by.name, id, to.cfg.NodeID, err)
				}
				if after := recorded(id); after != before {
					t.Errorf("%s moved %s's API address from %s to %s", by.name, id, before, after)
				}
			}
		}
	}
	admin, n3 := clientCA.Issue(t, "admin"), clusterCA.Issue(t, "n3")
	for _, to := range []*Server{leader, follower} {
		err := addNode(to, n3, "n1", "127.0.0.1:9", true)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `node "n3" may not replace "n1"`) {
			t.Errorf("node n3 replacing n1, at %s: %v; want invalid_argument, an operator's call", to.cfg.NodeID, err)
		}
	}
	if got := recorded("n1"); got != leader.Addr() {
		t.Errorf("after n3's replace, n1 is recorded at %s; want %s", got, leader.Addr())
	}
	// The operator replaces n1's API address, through a follower, and back.
	if err := addNode(follower, admin, "n1", "127.0.0.1:9", true); err != nil || recorded("n1") != "127.0.0.1:9" {
		t.Errorf("admin replacing n1: %v, recorded %s; want 127.0.0.1:9", err, recorded("n1"))
	}
	if err := addNode(leader, admin, "n1", leader.Addr(), true); err != nil || recorded("n1") != leader.Addr() {
		t.Errorf("admin replacing n1 back: %v, recorded %s; want %s", err, recorded("n1"), leader.Addr())
	}
	// n2 moves itself, through a follower; the record follows.
	moved := nodes[1].Addr()
	if err := addNode(follower, clusterCA.Issue(t, "n2"), "n2", "127.0.0.1:9"); err != nil || recorded("n2") != "127.0.0.1:9" {
		t.Errorf("n2 moving itself: %v, recorded %s; want 127.0.0.1:9", err, recorded("n2"))
	}
	if err := addNode(leader, clusterCA.Issue(t, "n2"), "n2", moved); err != nil || recorded("n2") != moved {
		t.Errorf("n2 moving itself back: %v, recorded %s; want %s", err, recorded("n2"), moved)
	}
}

// TestAnonymousCallIsRefusedUnread: with auth on, a call without
// credentials is answered unauthenticated, with the message the RPCs'
// interceptor gives, before fenced reads any of its body: a call whose body
// never ends gets its answer, over HTTP/1.1 and HTTP/2, as a Connect, gRPC
// or gRPC-Web call. Decoded before its refusal, a 1 KB gzip of a batch of
// 524,280 empty items cost 150 ms of CPU and 50 MB. A call with a valid
// bearer token is still read and served.
func TestAnonymousCallIsRefusedUnread(t *testing.T) {
	dir := t.TempDir()
	// Read whole or not at all before the client gives up: a body read
	// fails at the read timeout, answered with some other error.
	s := startWith(t, func(c *Config) { c.AuthFile, c.ReadTimeout = writeMatrixAuth(t, dir), 10*time.Second })
	const says = "this service needs credentials: a client certificate or a bearer token"
	batch, watch := fencev1connect.LeaseServiceAcquireBatchProcedure, fencev1connect.LeaseServiceWatchProcedure
	for _, c := range []struct {
		name   string
		client *http.Client
		path   string
		ctype  string
		answer func(resp *http.Response, body string) string // the code and message found
	}{
		{"HTTP/1.1, Connect", &http.Client{Transport: &http.Transport{}}, batch, "application/proto", connectAnswer},
		{"HTTP/2, Connect", h2cClient(0), batch, "application/proto", connectAnswer},
		{"HTTP/2, Connect streaming", h2cClient(0), watch, "application/connect+proto", func(_ *http.Response, body string) string { return body }},
		{"HTTP/2, gRPC", h2cClient(0), batch, "application/grpc", grpcAnswer},
		{"HTTP/1.1, gRPC-Web", &http.Client{Transport: &http.Transport{}}, batch, "application/grpc-web+proto", grpcAnswer},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			body, more := io.Pipe()
			defer more.Close()
			go more.Write([]byte{0, 0, 0x10, 0, 0}) // a start, and then nothing
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Addr()+c.path, body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", c.ctype)
			resp, err := c.client.Do(req)
			if err != nil {
				t.Fatalf("a call without credentials whose body never ends: %v; want it refused unread", err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			got := c.answer(resp, string(b))
			wantCode := `"code":"unauthenticated"`
			if strings.Contains(c.ctype, "grpc") {
				wantCode = "grpc-status 16"
			}
			if !strings.Contains(got, wantCode) || !strings.Contains(got, says) {
				t.Errorf("%s: %q; want %s, %q", resp.Status, got, wantCode, says)
			}
		})
	}

	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr(), connect.WithInterceptors(testBearer("Bearer orders-secret")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acqs, err := rpc.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{Acquires: []*fencev1.AcquireRequest{{Scope: "orders/unread", Holder: "h"}}}))
	if err != nil || acqs.Msg.Results[0].GetLease().GetToken() == 0 {
		t.Errorf("an AcquireBatch with a valid bearer token: %v, %v; want a grant", acqs, err)
	}
}

// grpcAnswer is the status and message of a gRPC error, in the trailers
// (read after the body), or of a gRPC-Web one, in the headers.
func grpcAnswer(resp *http.Response, _ string) string {
	return "grpc-status " + resp.Header.Get("Grpc-Status") + resp.Trailer.Get("Grpc-Status") + ": " +
		resp.Header.Get("Grpc-Message") + resp.Trailer.Get("Grpc-Message")
}

// connectAnswer is the code and message of a Connect unary error.
func connectAnswer(resp *http.Response, body string) string {
	if resp.StatusCode != http.StatusUnauthorized {
		return resp.Status + " " + body
	}
	return body
}
