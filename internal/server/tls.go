package server

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"time"
)

// TLS is the API's transport security. With Cert and Key set the API is
// served over TLS only; with ClientCA set too, a client may present a
// certificate signed by that CA (mutual TLS), and its common name is its
// identity for authorization. Nodes of a cluster use their own certificate
// as clients of each other when they forward and join; only a certificate
// of CA (or, with no CA given, of ClientCA) can be a node.
type TLS struct {
	Cert, Key string // PEM files
	ClientCA  string // PEM file of the CA that signs client certificates
	// CA verifies the certificates of peers this node dials; defaults to
	// ClientCA, then the system roots.
	CA string
}

func (t TLS) enabled() bool { return t.Cert != "" || t.Key != "" }

func (t TLS) validate() error {
	if (t.Cert == "") != (t.Key == "") {
		return errors.New("give both --tls-cert and --tls-key, or neither")
	}
	if !t.enabled() && (t.ClientCA != "" || t.CA != "") {
		return errors.New("--tls-client-ca and --tls-ca need --tls-cert and --tls-key")
	}
	return nil
}

// serverConfig is the API listener's TLS configuration.
func (t TLS) serverConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert/--tls-key: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	// Nodes present certificates of the cluster CA when they forward and
	// join, clients those of the client CA: accept both. Only the cluster
	// CA's make a node (authz.Authenticate).
	var cas []string
	for _, ca := range []string{t.ClientCA, t.CA} {
		if ca != "" && !slices.Contains(cas, ca) {
			cas = append(cas, ca)
		}
	}
	if len(cas) > 0 {
		pool, err := loadPool(cas...)
		if err != nil {
			return nil, err
		}
		c.ClientCAs = pool
		// Verified if given: a client may instead authenticate with a bearer
		// token, and one with neither is refused by the rules, not the handshake.
		c.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return c, nil
}

// peerTransport is how this node dials its peers' APIs: h2c without TLS,
// else HTTP/2 over TLS presenting this node's certificate.
func (t TLS) peerTransport() (*http.Transport, error) {
	tr := h2c()
	if !t.enabled() {
		return tr, nil
	}
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert/--tls-key: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if ca := cmp.Or(t.CA, t.ClientCA); ca != "" {
		if tc.RootCAs, err = loadPool(ca); err != nil {
			return nil, err
		}
	}
	tr.TLSClientConfig = tc
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP2(true)
	tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: 2 * time.Second, PingTimeout: 2 * time.Second}
	return tr, nil
}

// raftConfig is the Raft transport's TLS: this node's certificate, and the
// CA that every node's certificate must chain to, on both ends. Nil
// without TLS.
func (t TLS) raftConfig() (*tls.Config, error) {
	if !t.enabled() {
		return nil, nil
	}
	ca := cmp.Or(t.CA, t.ClientCA)
	if ca == "" {
		return nil, errors.New("running Raft over TLS needs --tls-ca (or --tls-client-ca): the CA that signs every node's certificate")
	}
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert/--tls-key: %w", err)
	}
	pool, err := loadPool(ca)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}, nil
}

// scheme is the URL scheme of this node's and its peers' APIs.
func (t TLS) scheme() string {
	if t.enabled() {
		return "https"
	}
	return "http"
}

// clusterCA is the pool a certificate must chain to for its holder to be
// a node of the cluster: --tls-ca, or with a single CA, --tls-client-ca.
// Nil without TLS or either CA.
func (t TLS) clusterCA() (*x509.CertPool, error) {
	ca := cmp.Or(t.CA, t.ClientCA)
	if !t.enabled() || ca == "" {
		return nil, nil
	}
	return loadPool(ca)
}

// singleCA reports whether one CA signs both clients' and nodes'
// certificates, so that any certificate it issues naming a node is that
// node.
func (t TLS) singleCA() bool {
	return t.enabled() && t.ClientCA != "" && (t.CA == "" || t.CA == t.ClientCA)
}

func loadPool(paths ...string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read CA: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s holds no PEM certificate", path)
		}
	}
	return pool, nil
}
