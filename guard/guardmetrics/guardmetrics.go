// Package guardmetrics counts a guard's accepted and stale writes in
// Prometheus: fence_guard_accepts_total and fence_guard_rejections_total,
// labelled by adapter only, so the number of series stays bounded however
// many scopes there are. Scopes and tokens of rejections go to the log
// (guard.WithLogger), not to labels.
//
// FollowerCollector reports a guard/follow Follower's progress:
// fence_follow_lag_seconds, fence_follow_marks_advanced_total,
// fence_follow_resyncs_total and fence_follow_watch_position, labelled by
// the prefix it follows.
package guardmetrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fence-dev/fence/guard"
)

// Metrics holds the counters. It is safe for concurrent use.
type Metrics struct {
	accepts    *prometheus.CounterVec
	rejections *prometheus.CounterVec
}

// New creates the counters and registers them with reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		accepts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_guard_accepts_total",
			Help: "Writes a guard accepted: their token was not older than the highest accepted for their scope.",
		}, []string{"adapter"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_guard_rejections_total",
			Help: "Writes a guard rejected as stale: a newer token had been accepted for their scope.",
		}, []string{"adapter"}),
	}
	for _, c := range []prometheus.Collector{m.accepts, m.rejections} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return m, nil
}

// Observer returns a guard.Observer that counts under the given adapter
// label ("http", "grpc", "sql", …).
func (m *Metrics) Observer(adapter string) guard.Observer {
	return observer{accepts: m.accepts.WithLabelValues(adapter), rejections: m.rejections.WithLabelValues(adapter)}
}

type observer struct{ accepts, rejections prometheus.Counter }

func (o observer) Accepted(string)            { o.accepts.Inc() }
func (o observer) Rejected(*guard.StaleError) { o.rejections.Inc() }
