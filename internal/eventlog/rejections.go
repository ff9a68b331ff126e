package eventlog

import (
	"slices"
	"sync"
	"time"
)

const (
	// rejectionWindow is how far back the per-scope counts reach, in
	// rejectionBuckets buckets.
	rejectionWindow  = 10 * time.Minute
	rejectionBuckets = 10
	// maxRejectedScopes bounds the scopes counted; past it the scope
	// rejected longest ago is forgotten.
	maxRejectedScopes = 1000
	// recentRejections is how many rejections are kept as examples.
	recentRejections = 50
)

// Rejection is one stale write a guard reported.
type Rejection struct {
	Guard     string
	Scope     string
	Presented uint64
	Highest   uint64
	Holder    string // of the presented token, if the ring retains an event of it naming one
	At        time.Time
}

// Rejections keeps what guards reported: counts per scope over the last
// rejectionWindow and the most recent examples. It is in memory only, on
// the leader. It is safe for concurrent use.
type Rejections struct {
	mu      sync.Mutex
	scopes  map[string]*scopeRejections
	recent  []Rejection // newest last, at most recentRejections
	dropped uint64      // reported as dropped by guards
}

type scopeRejections struct {
	buckets [rejectionBuckets]uint64 // counts per bucket of the window
	starts  [rejectionBuckets]int64  // each bucket's start, in bucket units
	last    time.Time
	example Rejection // the most recent
}

// NewRejections returns an empty log.
func NewRejections() *Rejections {
	return &Rejections{scopes: make(map[string]*scopeRejections)}
}

func bucketOf(t time.Time) int64 { return t.UnixNano() / int64(rejectionWindow/rejectionBuckets) }

// Add records one reported rejection.
func (l *Rejections) Add(r Rejection) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sc := l.scopes[r.Scope]
	if sc == nil {
		if len(l.scopes) >= maxRejectedScopes {
			var oldest string
			for name, o := range l.scopes {
				if oldest == "" || o.last.Before(l.scopes[oldest].last) {
					oldest = name
				}
			}
			delete(l.scopes, oldest)
		}
		sc = &scopeRejections{}
		l.scopes[r.Scope] = sc
	}
	b := bucketOf(r.At)
	i := int(b % rejectionBuckets)
	if sc.starts[i] != b {
		sc.starts[i], sc.buckets[i] = b, 0
	}
	sc.buckets[i]++
	if !r.At.Before(sc.last) {
		sc.last, sc.example = r.At, r
	}
	l.recent = append(l.recent, r)
	if len(l.recent) > recentRejections {
		l.recent = slices.Delete(l.recent, 0, len(l.recent)-recentRejections)
	}
}

// ScopeCount is one scope's rejections within the window.
type ScopeCount struct {
	Scope  string
	Count  uint64
	Last   Rejection
	Guards []string
}

// Summary returns the scopes with rejections within the window before now,
// most rejected first, and the recent examples, newest first.
func (l *Rejections) Summary(now time.Time) ([]ScopeCount, []Rejection, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	since := bucketOf(now) - rejectionBuckets + 1
	var counts []ScopeCount
	for name, sc := range l.scopes {
		var n uint64
		for i, b := range sc.buckets {
			if sc.starts[i] >= since {
				n += b
			}
		}
		if n > 0 {
			counts = append(counts, ScopeCount{Scope: name, Count: n, Last: sc.example})
		}
	}
	slices.SortFunc(counts, func(a, b ScopeCount) int {
		if a.Count != b.Count {
			return int(b.Count) - int(a.Count)
		}
		return b.Last.At.Compare(a.Last.At)
	})
	recent := slices.Clone(l.recent)
	slices.Reverse(recent)
	return counts, recent, l.dropped
}

// AddDropped counts rejections a guard could not report.
func (l *Rejections) AddDropped(n uint64) {
	l.mu.Lock()
	l.dropped += n
	l.mu.Unlock()
}
