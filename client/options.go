package client

import (
	"crypto/tls"
	"net/http"
	"time"
)

// Option configures a Client.
type Option interface{ applyClient(*config) }

// AcquireOption configures one acquire.
type AcquireOption interface{ applyAcquire(*acquireConfig) }

// BothOption is an option that works both as a Client default and for one
// acquire.
type BothOption interface {
	Option
	AcquireOption
}

type config struct {
	httpClient   *http.Client
	tls          *tls.Config
	bearer       string
	retryTimeout time.Duration
	acquire      acquireConfig // defaults for every acquire
}

type acquireConfig struct {
	holder    string
	ttl       time.Duration
	wait      bool
	requestID string
	margin    time.Duration
}

// WithHTTPClient makes the client use h for its calls and watches, to
// every address. By default a call goes over an HTTP/1.1 connection of its
// own, and watches and the calls beyond 64 at once share one HTTP/2
// connection a node, without TLS (h2c) unless WithTLS is given (see the
// package documentation, Connections).
func WithHTTPClient(h *http.Client) Option { return optionFunc(func(c *config) { c.httpClient = h }) }

// WithTLS makes the client speak HTTPS (HTTP/1.1 and HTTP/2 over TLS)
// with c: its RootCAs verify the service, its Certificates identify the
// client to a service that requires client certificates. Addresses without
// a scheme then mean https://. Ignored with WithHTTPClient.
func WithTLS(c *tls.Config) Option { return optionFunc(func(cfg *config) { cfg.tls = c }) }

// WithBearerToken sends token as "Authorization: Bearer" with every call,
// for a service whose auth file names it.
func WithBearerToken(token string) Option {
	return optionFunc(func(cfg *config) { cfg.bearer = token })
}

// WithRetryTimeout bounds how long a call keeps retrying while the service
// is unreachable or has no leader (default 10s). It is one budget for the
// whole call, however many of the client's addresses it tries; 0 makes
// every call a single attempt. The call's context can end it sooner.
func WithRetryTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retryTimeout = d })
}

// WithHolder names the holder, for people reading lists and logs (default
// "PROGRAM-PID@HOST").
func WithHolder(name string) BothOption {
	return bothFunc(func(a *acquireConfig) { a.holder = name })
}

// WithTTL sets the lease's time to live (default 10s). The lease renews
// itself at about a third of it.
func WithTTL(d time.Duration) BothOption { return bothFunc(func(a *acquireConfig) { a.ttl = d }) }

// WithDriftMargin sets how much earlier than the service the lease counts
// itself expired, to cover clock rate differences and scheduling delays
// (default a twentieth of the TTL, at least 5ms).
func WithDriftMargin(d time.Duration) BothOption {
	return bothFunc(func(a *acquireConfig) { a.margin = d })
}

// WithWait makes an acquire of a held scope wait in line (first come, first
// served) until it is granted or its context ends, instead of failing with
// fence.ErrHeld.
func WithWait() AcquireOption { return acquireFunc(func(a *acquireConfig) { a.wait = true }) }

// WithRequestID sets the acquire's request ID (default: random). Retries of
// one acquire carry the same ID, so the service returns the same grant
// instead of a second token while that grant is among the scope's four most
// recent (see the package documentation, Retries). The ID returns the
// grant, lease ID included, to whoever presents it as the same owner (the
// identity with auth on, the holder name with auth off): keep it as secret
// as the lease ID, and as hard to guess.
func WithRequestID(id string) AcquireOption {
	return acquireFunc(func(a *acquireConfig) { a.requestID = id })
}

type optionFunc func(*config)

func (f optionFunc) applyClient(c *config) { f(c) }

type acquireFunc func(*acquireConfig)

func (f acquireFunc) applyAcquire(a *acquireConfig) { f(a) }

type bothFunc func(*acquireConfig)

func (f bothFunc) applyClient(c *config)         { f(&c.acquire) }
func (f bothFunc) applyAcquire(a *acquireConfig) { f(a) }
