package guardtest

import (
	"testing"
	"time"
)

// Compare benchmarks a fenced write beside the same plain write. It runs
// each as a sub-benchmark of its own ("plain", "fenced"), and then both
// alternately in a third, "both", which reports each one's mean time and
// their ratio (plain-ns/op, fenced-ns/op, fenced/plain). On a machine
// shared with other work the load drifts between the first two;
// alternating exposes both to the same drift, so the ratio of "both" is
// the one to quote.
func Compare(b *testing.B, plain, fenced func() error) {
	for _, c := range []struct {
		name string
		op   func() error
	}{{"plain", plain}, {"fenced", fenced}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.op(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("both", func(b *testing.B) {
		var tp, tf time.Duration
		for b.Loop() {
			t0 := time.Now()
			if err := plain(); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := fenced(); err != nil {
				b.Fatal(err)
			}
			tp, tf = tp+t1.Sub(t0), tf+time.Since(t1)
		}
		b.ReportMetric(float64(tp.Nanoseconds())/float64(b.N), "plain-ns/op")
		b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N), "fenced-ns/op")
		b.ReportMetric(float64(tf)/float64(tp), "fenced/plain")
	})
}
