// Package authz decides who is calling and whether they may: identities
// from verified client certificates or bearer tokens (or, from a node
// forwarding a call, the identity it vouches for), the rules of an auth
// file, checked per RPC and per scope, and the count of leases each
// identity holds.
package authz

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
)

// Auth is who may do what. With auth on (an auth file given), every call
// needs an identity, from a verified client certificate's common name or a
// bearer token, and a rule that allows it: there is no default allow.
type Auth struct {
	// Tokens maps bearer tokens, by the hex SHA-256 of the token, to
	// identities; the file holds no token in the clear.
	Tokens []struct {
		Identity string `json:"identity"`
		SHA256   string `json:"sha256"`
	} `json:"tokens"`
	// Nodes are the identities of the cluster's own nodes: a node forwarding
	// a call to the leader says on whose behalf, and only they are believed.
	Nodes []string `json:"nodes"`
	Rules []Rule   `json:"rules"`

	byHash map[[sha256.Size]byte]string // Tokens decoded once, at load
}

// Rule allows an identity some operations on the scopes under a prefix
// ("" is every scope).
type Rule struct {
	Identity string   `json:"identity"`
	Prefix   string   `json:"prefix"`
	Allow    []string `json:"allow"`
}

// The operations rules name. "cluster" covers the cluster service (status,
// membership, key rotation); "status" the metrics, events and status page;
// "report" a guard's reports of stale rejections, for its scopes.
var operations = []string{"acquire", "renew", "release", "get", "list", "watch", "report", "cluster", "status"}

// Load reads an auth file (JSON, in the form of Auth).
func Load(path string) (*Auth, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var a Auth
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	a.byHash = make(map[[sha256.Size]byte]string)
	for _, t := range a.Tokens {
		b, err := hex.DecodeString(t.SHA256)
		if err != nil || len(b) != sha256.Size || t.Identity == "" {
			return nil, fmt.Errorf("auth file %s: a token needs an identity and the 64 hex digits of its SHA-256", path)
		}
		a.byHash[[sha256.Size]byte(b)] = t.Identity
	}
	for _, r := range a.Rules {
		if r.Identity == "" {
			return nil, fmt.Errorf("auth file %s: a rule without an identity", path)
		}
		for _, op := range r.Allow {
			if !slices.Contains(operations, op) {
				return nil, fmt.Errorf("auth file %s: rule for %q allows %q; operations are %s", path, r.Identity, op, strings.Join(operations, ", "))
			}
		}
	}
	return &a, nil
}

// allows reports whether id may do op on scope (for list and watch: on
// every scope under the prefix scope).
func (a *Auth) allows(id, op, scope string) bool {
	if op == "cluster" && slices.Contains(a.Nodes, id) {
		return true // nodes join and ask each other for their state
	}
	for _, r := range a.Rules {
		if r.Identity == id && slices.Contains(r.Allow, op) && strings.HasPrefix(scope, r.Prefix) {
			return true
		}
	}
	return false
}

// Allowed refuses, with a PermissionDenied error, an item of a batch call
// that the caller may not do: op on scope. The Interceptor checks only
// that a batch call has an identity, so one item refused never fails the
// others; the handler asks for each item. A nil Auth (auth off) allows
// everything. It is safe for concurrent use.
func (a *Auth) Allowed(ctx context.Context, op, scope string) error {
	if a == nil {
		return nil
	}
	id := Identity(ctx)
	if !a.allows(id, op, scope) {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%q may not %s %q", id, op, scope))
	}
	return nil
}

// IsNode reports whether id is one of the cluster's nodes. A nil Auth
// (auth off) knows no identity, so no node. It is safe for concurrent use.
func (a *Auth) IsNode(id string) bool {
	return a != nil && id != "" && slices.Contains(a.Nodes, id)
}

// tokenIdentity looks the bearer token up by its SHA-256. Looking up a
// digest leaks nothing useful through timing: a caller cannot steer it
// byte by byte toward a stored one.
func (a *Auth) tokenIdentity(bearer string) string {
	return a.byHash[sha256.Sum256([]byte(bearer))]
}

type identityKey struct{}

// Identity returns the caller's identity that Authenticate found, "" if
// none (or auth is off).
func Identity(ctx context.Context) string {
	id, _ := ctx.Value(identityKey{}).(string)
	return id
}

// identityHeader carries, from a node forwarding a call, the identity of
// the caller it authenticated.
const identityHeader = "Fence-Identity"

// ForwardedHeader marks a call that a node forwards to the leader, with
// the forwarding node's ID. A node's call so marked acts for the identity
// the node authenticated (Fence-Identity), and for no one without it:
// never as the node itself.
const ForwardedHeader = "Fence-Forwarded-By"

// Authenticate finds the caller's identity and puts it in the request's
// context. It runs before forwarding, so the leader learns who a forwarded
// call is for. It refuses an RPC without an identity, unread, in the RPC's
// own error format; the Interceptor checks the rules for the others. Of
// the other paths, only those public reports true for are open to callers
// without the "status" operation.
//
// A certificate whose common name is listed in Nodes is that node only if
// it chains to clusterCA, the CA of the cluster's own nodes; any other
// certificate naming a node gives no identity at all, so a client
// certificate can never act as a node. A nil clusterCA makes no
// certificate a node.
//
// A node's call marked ForwardedHeader is made for the caller the node
// authenticated: it has the identity the node vouches for or, without
// one, no identity at all, never the node's own name. (Followers of
// earlier builds forwarded calls without credentials so, and at the
// leader they acted as the node, cluster operations included.)
func (a *Auth) Authenticate(next http.Handler, public func(path string) bool, clusterCA *x509.CertPool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var certID string
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			certID = r.TLS.PeerCertificates[0].Subject.CommonName
			if slices.Contains(a.Nodes, certID) && !isNode(r, clusterCA) {
				certID = ""
			}
		}
		id := certID
		fwd := r.Header.Get(identityHeader)
		if node := certID != "" && slices.Contains(a.Nodes, certID); node && (fwd != "" || r.Header.Get(ForwardedHeader) != "") {
			id = fwd
		} else if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			id = a.tokenIdentity(b)
		}
		r.Header.Del(identityHeader)
		if id != "" {
			r.Header.Set(identityHeader, id) // for the leader, if forwarded
			r = r.WithContext(context.WithValue(r.Context(), identityKey{}, id))
		}
		switch {
		case strings.HasPrefix(r.URL.Path, rpcPrefix):
			// Refused here, before its body is read: a call without an
			// identity costs no inflating or decoding, whatever its body.
			// (Decoded first, a 1 KB gzip of a batch of 524,280 empty
			// items cost 150 ms of CPU and 50 MB before its refusal.)
			if err := needIdentity(id); err != nil {
				if r.ProtoMajor == 1 && r.ContentLength != 0 {
					// Else net/http reads up to 256 KiB of the body
					// left to keep the connection, waiting for a slow one.
					w.Header().Set("Connection", "close")
				}
				rpcErrors.Write(w, r, err)
				return
			}
		case !public(r.URL.Path) && !a.allows(id, "status", ""):
			http.Error(w, "fence: this needs an identity allowed \"status\"", httpDenied(id))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// rpcPrefix begins the path of every RPC of the fence.v1 services.
const rpcPrefix = "/fence.v1."

// rpcErrors writes an RPC's refusal as its protocol does (Connect, gRPC,
// gRPC-Web), as the handler would have.
var rpcErrors = connect.NewErrorWriter()

// needIdentity refuses a call without an identity: every RPC needs one
// with auth on. Authenticate refuses such a call before reading its body;
// the Interceptor asks again, for a handler reached some other way.
func needIdentity(id string) error {
	if id == "" {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("this service needs credentials: a client certificate or a bearer token"))
	}
	return nil
}

// nodeCheck is one connection's answer to whether its peer's certificate
// is a node's: the certificate cannot change after the handshake, so the
// chain is verified once per connection, not per request.
type nodeCheck struct {
	once sync.Once
	node bool
}

type nodeCheckKey struct{}

// ConnContext, as an http.Server's ConnContext, lets Authenticate verify a
// connection's certificate once for all the requests it carries.
func ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, nodeCheckKey{}, new(nodeCheck))
}

// isNode reports whether the request's peer certificate chains to the
// cluster CA, remembered for the connection if ConnContext was set.
func isNode(r *http.Request, clusterCA *x509.CertPool) bool {
	nc, ok := r.Context().Value(nodeCheckKey{}).(*nodeCheck)
	if !ok {
		return nodeCertificate(r.TLS, clusterCA)
	}
	nc.once.Do(func() { nc.node = nodeCertificate(r.TLS, clusterCA) })
	return nc.node
}

// nodeCertificate reports whether the peer's certificate chains to the
// cluster CA, for client authentication.
func nodeCertificate(cs *tls.ConnectionState, clusterCA *x509.CertPool) bool {
	if clusterCA == nil {
		return false
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: clusterCA, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return err == nil
}

func httpDenied(id string) int {
	if id == "" {
		return http.StatusUnauthorized
	}
	return http.StatusForbidden
}

// Interceptor checks every RPC against the rules: an interceptor, so it
// sees the request message and hence the scope.
func (a *Auth) Interceptor() connect.Interceptor { return authorizer{a} }

type authorizer struct{ a *Auth }

func (z authorizer) check(ctx context.Context, procedure string, msg any) error {
	id := Identity(ctx)
	op, scopes := rpcOperation(procedure, msg)
	if err := needIdentity(id); err != nil {
		return err
	}
	if op == "report" && len(scopes) == 0 && !z.a.allowsSome(id, op) {
		// A report of dropped rejections only names no scope; counting it
		// is harmless, but it still takes a guard, one that may report.
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%q may not report on any scope", id))
	}
	for _, scope := range scopes {
		if !z.a.allows(id, op, scope) {
			return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%q may not %s %q", id, op, scope))
		}
	}
	return nil
}

// allowsSome reports whether a rule allows id op on some scope.
func (a *Auth) allowsSome(id, op string) bool {
	return slices.ContainsFunc(a.Rules, func(r Rule) bool { return r.Identity == id && slices.Contains(r.Allow, op) })
}

// rpcOperation names the operation of a call and the scopes (or prefixes)
// it touches, each of which the caller must be allowed. A batch call names
// none: its handler authorizes each item on its own (Allowed).
func rpcOperation(procedure string, msg any) (op string, scopes []string) {
	if strings.HasPrefix(procedure, "/"+fencev1connect.ClusterServiceName+"/") {
		return "cluster", []string{""}
	}
	switch m := msg.(type) {
	case *fencev1.AcquireRequest:
		return "acquire", []string{m.Scope}
	case *fencev1.RenewRequest:
		return "renew", []string{m.Scope}
	case *fencev1.RenewBatchRequest:
		return "renew", nil
	case *fencev1.AcquireBatchRequest:
		return "acquire", nil
	case *fencev1.ReleaseBatchRequest:
		return "release", nil
	case *fencev1.ReleaseRequest:
		return "release", []string{m.Scope}
	case *fencev1.GetRequest:
		return "get", []string{m.Scope}
	case *fencev1.ListRequest:
		return "list", []string{m.Prefix}
	case *fencev1.WatchRequest:
		return "watch", []string{m.Prefix}
	case *fencev1.ReportRejectionsRequest:
		// Each rejection on its own scope: a guard allowed orders/ and
		// billing/ may report both in one call. One scope it may not
		// report on refuses the whole report, naming that scope, rather
		// than dropping rejections its operator would never hear of.
		scopes := make([]string, len(m.GetRejections()))
		for i, r := range m.GetRejections() {
			scopes[i] = r.GetScope()
		}
		return "report", scopes
	}
	return "unknown", []string{""}
}

func (z authorizer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := z.check(ctx, req.Spec().Procedure, req.Any()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (authorizer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (z authorizer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, &checkedStream{StreamingHandlerConn: conn, z: z, ctx: ctx})
	}
}

// checkedStream authorizes a stream on its first message, which carries
// the scope or prefix.
type checkedStream struct {
	connect.StreamingHandlerConn
	z       authorizer
	ctx     context.Context
	checked bool
}

func (c *checkedStream) Receive(m any) error {
	if err := c.StreamingHandlerConn.Receive(m); err != nil {
		return err
	}
	if !c.checked {
		if err := c.z.check(c.ctx, c.Spec().Procedure, m); err != nil {
			return err
		}
		c.checked = true
	}
	return nil
}
