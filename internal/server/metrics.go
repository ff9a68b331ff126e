package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fence-dev/fence/internal/eventlog"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/version"
)

// maxHolderMemory bounds how many scopes' last holders the transition
// counter remembers; past it the memory starts afresh, and the first grant
// of each scope after that is not counted as a transition.
const maxHolderMemory = 100_000

// metrics is one server's Prometheus metrics, in a registry of its own so
// that several servers can run in one process (fencetest). Lease events
// are counted by the node that is the serving leader when they happen, so
// summing a counter over the nodes of a cluster counts each event once;
// gauges that read the replicated state (leases held) are reported by
// every node. Its methods are safe for concurrent use.
type metrics struct {
	reg *prometheus.Registry

	grants, renewals, releases, expirations, losses, transitions prometheus.Counter

	rejections, rejectionsDropped prometheus.Counter
	tokenGap                      prometheus.Histogram

	waits       prometheus.Counter
	waiting     prometheus.Gauge
	waitSeconds *prometheus.HistogramVec
	rpcSeconds  *prometheus.HistogramVec

	connsRefused *prometheus.CounterVec

	mu         sync.Mutex
	lastHolder map[string]string // scope → holder of its last grant seen as leader
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), lastHolder: make(map[string]string)}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m.grants = counter("fence_lease_grants_total", "Leases granted, each with a new token.")
	m.renewals = counter("fence_lease_renewals_total", "Renewals confirmed to their holder.")
	m.releases = counter("fence_lease_releases_total", "Leases released by their holder.")
	m.expirations = counter("fence_lease_expirations_total", "Leases expired by the leader because their holder stopped renewing.")
	m.losses = counter("fence_lease_losses_total", "Renewals answered lost: the lease had expired, was being expired or was superseded.")
	m.transitions = counter("fence_lease_transitions_total", "Grants of a scope to a holder other than the one of its previous grant.")
	m.rejections = counter("fence_stale_rejections_reported_total", "Writes that guards refused as stale and reported: their holder kept writing after losing its lease.")
	m.rejectionsDropped = counter("fence_stale_rejections_dropped_total", "Stale rejections that guards could not report (their buffer was full) and counted instead.")
	m.tokenGap = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fence_stale_token_gap",
		Help:    "For each reported stale rejection, the highest token the guard had accepted minus the token presented: how many grants behind the stale writer was.",
		Buckets: []float64{0, 1, 2, 3, 5, 10, 100, 1000},
	})
	m.waits = counter("fence_acquire_waits_total", "Acquires that queued behind a held lease.")
	m.waiting = prometheus.NewGauge(prometheus.GaugeOpts{Name: "fence_acquire_waiting", Help: "Acquires waiting in line now."})
	m.waitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fence_acquire_wait_seconds",
		Help:    "How long queued acquires waited, by outcome: granted, or abandoned when the caller gave up.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	}, []string{"outcome"})
	m.rpcSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fence_rpc_duration_seconds",
		Help:    "Time to answer unary RPCs served by this node (not those it forwarded), by procedure and code.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"procedure", "code"})
	m.connsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fence_connections_refused_total",
		Help: "API connections closed as soon as accepted, by the limit they met: max-conns (the server's) or max-conns-per-addr (one remote address's).",
	}, []string{"limit"})
	for _, l := range []string{limitTotal, limitPerAddr} {
		m.connsRefused.WithLabelValues(l) // shown at 0 before the first refusal
	}
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fence_leases_held",
		Help: "Scopes held by a lease now, in this node's replicated state.",
	}, func() float64 {
		var n int
		s.node.Read(func(st *fsm.State) { n = st.HeldCount() })
		return float64(n)
	})
	records := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fence_scope_records",
		Help: "Scope records this node's replicated state keeps: held, waited for, or idle. From log format 2 it stays within the scopes held or waited for plus a few thousand idle ones.",
	}, func() float64 {
		var n int
		s.node.Read(func(st *fsm.State) { n = st.Records() })
		return float64(n)
	})
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fence_ready",
		Help: "1 when this node is the leader and serving, else 0.",
	}, func() float64 { return bool01(s.lessor.Ready()) })
	free := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fence_data_dir_free_bytes",
		Help: "Bytes free on the data directory's disk; below --min-free-space the leader refuses new grants and /readyz answers 503.",
	}, func() float64 { return s.disk.freeBytes() })
	bi := version.Get()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "fence_build_info",
		Help:        "Always 1; its labels name the running build: the module version, the commit (empty when the build recorded none) and the Go release.",
		ConstLabels: prometheus.Labels{"version": bi.Short(), "revision": bi.Revision, "goversion": bi.GoVersion},
	})
	build.Set(1)
	m.reg.MustRegister(
		build, free,
		m.grants, m.renewals, m.releases, m.expirations, m.losses, m.transitions,
		m.rejections, m.rejectionsDropped, m.tokenGap,
		m.waits, m.waiting, m.waitSeconds, m.rpcSeconds, m.connsRefused, held, records, ready,
		raftCollector{s},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// conns exports the open connections l counts.
func (m *metrics) conns(l *connLimiter) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fence_connections_open",
		Help: "API connections open now, counted against --max-conns.",
	}, func() float64 { return float64(l.openConns()) }))
}

// handler serves the registry in Prometheus' text and protobuf formats.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// event counts a lease event.
func (m *metrics) event(e eventlog.Event) {
	switch e.Kind {
	case eventlog.Granted:
		m.grants.Inc()
		m.mu.Lock()
		prev, seen := m.lastHolder[e.Scope]
		if !seen && len(m.lastHolder) >= maxHolderMemory {
			clear(m.lastHolder)
		}
		m.lastHolder[e.Scope] = e.Holder
		m.mu.Unlock()
		if seen && prev != e.Holder {
			m.transitions.Inc()
		}
	case eventlog.Renewed:
		m.renewals.Inc()
	case eventlog.Released:
		m.releases.Inc()
	case eventlog.Expired:
		m.expirations.Inc()
	case eventlog.Lost:
		m.losses.Inc()
	}
}

// rejected counts a reported stale rejection.
func (m *metrics) rejected(r eventlog.Rejection) {
	m.rejections.Inc()
	m.tokenGap.Observe(float64(r.Highest - r.Presented))
}

// queued counts an acquire that starts waiting in line and returns the
// function that records the end of its wait.
func (m *metrics) queued() func(granted bool) {
	m.waits.Inc()
	m.waiting.Inc()
	start := time.Now()
	return func(granted bool) {
		m.waiting.Dec()
		outcome := "granted"
		if !granted {
			outcome = "abandoned"
		}
		m.waitSeconds.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
	}
}

// interceptor times unary RPCs. Streams (Watch) last as long as their
// watcher wants and are not timed.
func (m *metrics) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			start := time.Now()
			resp, err := next(ctx, req)
			code := "ok"
			if err != nil {
				code = connect.CodeOf(err).String()
			}
			m.rpcSeconds.WithLabelValues(req.Spec().Procedure, code).Observe(time.Since(start).Seconds())
			return resp, err
		}
	})
}

// raftCollector reports the node's Raft progress at each scrape.
type raftCollector struct{ s *Server }

var (
	raftLeaderDesc       = prometheus.NewDesc("fence_raft_leader", "1 when this node is the Raft leader, else 0.", nil, nil)
	raftHasLeaderDesc    = prometheus.NewDesc("fence_raft_has_leader", "1 when this node knows of a leader (itself or another), else 0.", nil, nil)
	raftTermDesc         = prometheus.NewDesc("fence_raft_term", "The node's current Raft term.", nil, nil)
	raftLastLogDesc      = prometheus.NewDesc("fence_raft_last_log_index", "The index of the last entry in the node's Raft log.", nil, nil)
	raftCommitDesc       = prometheus.NewDesc("fence_raft_commit_index", "The last Raft log index the node knows to be committed.", nil, nil)
	raftAppliedDesc      = prometheus.NewDesc("fence_raft_applied_index", "The last Raft log index applied to the node's lease state.", nil, nil)
	raftContactDesc      = prometheus.NewDesc("fence_raft_last_contact_seconds", "On a follower, the time since it last heard from the leader; absent on the leader and before any contact.", nil, nil)
	raftSnapIndexDesc    = prometheus.NewDesc("fence_raft_last_snapshot_index", "The Raft log index of the newest snapshot on disk; absent before the first.", nil, nil)
	raftSnapAgeDesc      = prometheus.NewDesc("fence_raft_last_snapshot_age_seconds", "The age of the newest snapshot on disk; absent before the first.", nil, nil)
	raftCollectorMetrics = []*prometheus.Desc{raftLeaderDesc, raftHasLeaderDesc, raftTermDesc, raftLastLogDesc, raftCommitDesc, raftAppliedDesc, raftContactDesc, raftSnapIndexDesc, raftSnapAgeDesc}
)

func (c raftCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range raftCollectorMetrics {
		ch <- d
	}
}

func (c raftCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.node.Stats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	gauge(raftLeaderDesc, bool01(st.Leader))
	gauge(raftHasLeaderDesc, bool01(st.LeaderID != ""))
	gauge(raftTermDesc, float64(st.Term))
	gauge(raftLastLogDesc, float64(st.LastLogIndex))
	gauge(raftCommitDesc, float64(st.CommitIndex))
	gauge(raftAppliedDesc, float64(st.AppliedIndex))
	if !st.LastContact.IsZero() {
		gauge(raftContactDesc, time.Since(st.LastContact).Seconds())
	}
	if !st.LastSnapshotAt.IsZero() {
		gauge(raftSnapIndexDesc, float64(st.LastSnapshotIndex))
		gauge(raftSnapAgeDesc, time.Since(st.LastSnapshotAt).Seconds())
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
