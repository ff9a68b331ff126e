package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/testcerts"
)

// TestAuthorizationMatrix calls every RPC with no credentials, with a
// certificate from another CA, with an identity whose rules do not cover
// the scope (or the cluster), and with valid credentials (a certificate,
// then a bearer token), and checks each answer's exact code.
func TestAuthorizationMatrix(t *testing.T) {
	dir := t.TempDir()
	ca, rogue := testcerts.NewCA(t, "fence test CA"), testcerts.NewCA(t, "rogue CA")
	caFile := ca.WriteCA(t, dir, "ca")
	srvCert, srvKey := testcerts.Write(t, dir, "server", ca.Issue(t, "n1"))
	sum := sha256.Sum256([]byte("orders-secret"))
	authFile := filepath.Join(dir, "auth.json")
	os.WriteFile(authFile, fmt.Appendf(nil, `{
		"tokens": [{"identity": "orders-svc", "sha256": %q}],
		"nodes": ["n1"],
		"rules": [
			{"identity": "orders-svc", "prefix": "orders/", "allow": ["acquire", "renew", "release", "get", "list", "watch", "report"]},
			{"identity": "admin", "prefix": "", "allow": ["cluster"]}
		]}`, hex.EncodeToString(sum[:])), 0o600)

	s := startWith(t, func(cfg *Config) {
		cfg.TLS = TLS{Cert: srvCert, Key: srvKey, ClientCA: caFile}
		cfg.AuthFile = authFile
	})
	roots := ca.Pool()
	clientFor := func(certs []tls.Certificate, bearer string) (fencev1connect.LeaseServiceClient, fencev1connect.ClusterServiceClient) {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP2(true)
		h := &http.Client{Transport: tr}
		var opts []connect.ClientOption
		if bearer != "" {
			opts = append(opts, connect.WithInterceptors(testBearer("Bearer "+bearer)))
		}
		base := "https://" + s.Addr()
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
					if err == nil || !strings.Contains(err.Error(), "certificate") {
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
		resp, err := (&http.Client{Transport: tr}).Get("https://" + s.Addr() + path)
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
