package guardmetrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Follower is what FollowerCollector reads, at each scrape, from a
// guard/follow Follower (whose methods these are) or anything that
// reports the same progress.
type Follower interface {
	Prefix() string
	Lag() time.Duration
	Advanced() uint64
	Resyncs() uint64
	Position() uint64
}

// FollowerCollector is a prometheus.Collector of a follower's progress,
// labelled by the prefix it follows (one series per follower):
// fence_follow_lag_seconds, fence_follow_marks_advanced_total,
// fence_follow_resyncs_total and fence_follow_watch_position. It reads
// the follower at each scrape and is safe for concurrent use.
type FollowerCollector struct {
	f                                Follower
	lag, advanced, resyncs, position *prometheus.Desc
}

// NewFollowerCollector returns a collector of f's progress; register it
// with a prometheus.Registerer. Followers of different prefixes may share
// a registry.
func NewFollowerCollector(f Follower) *FollowerCollector {
	labels := prometheus.Labels{"prefix": f.Prefix()}
	return &FollowerCollector{
		f: f,
		lag: prometheus.NewDesc("fence_follow_lag_seconds",
			"How far behind the service the follower is: the age of the oldest grant or closing received and not yet recorded in the store, or the time since it stopped (or has not yet started) following; 0 when caught up.",
			nil, labels),
		advanced: prometheus.NewDesc("fence_follow_marks_advanced_total",
			"Marks the follower advanced in the store, to a grant's token or a lease's closing token (including advances the store found already done).",
			nil, labels),
		resyncs: prometheus.NewDesc("fence_follow_resyncs_total",
			"Times the follower read the state of the leases it knew held instead of resuming its watch: the service no longer held the events to resume from, or its watch had never started.",
			nil, labels),
		position: prometheus.NewDesc("fence_follow_watch_position",
			"The position in the service's watch stream up to which the follower has received every event; 0 before the service took its watch and while it reads the state again.",
			nil, labels),
	}
}

// Describe implements prometheus.Collector.
func (c *FollowerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.advanced
	ch <- c.resyncs
	ch <- c.position
}

// Collect implements prometheus.Collector.
func (c *FollowerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range []struct {
		d *prometheus.Desc
		t prometheus.ValueType
		v float64
	}{
		{c.lag, prometheus.GaugeValue, c.f.Lag().Seconds()},
		{c.advanced, prometheus.CounterValue, float64(c.f.Advanced())},
		{c.resyncs, prometheus.CounterValue, float64(c.f.Resyncs())},
		{c.position, prometheus.GaugeValue, float64(c.f.Position())},
	} {
		metric, err := prometheus.NewConstMetric(m.d, m.t, m.v)
		if err != nil {
			metric = prometheus.NewInvalidMetric(m.d, err)
		}
		ch <- metric
	}
}
