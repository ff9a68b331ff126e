package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/wire"
)

const (
	// maxReport bounds the rejections of one ReportRejections request.
	maxReport = 1000
	// maxGuardName bounds a guard's name, in bytes.
	maxGuardName = 128
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

// rejection is one stale write a guard reported.
type rejection struct {
	Guard     string
	Scope     string
	Presented uint64
	Highest   uint64
	Holder    string // of the presented token, if its grant is still retained
	At        time.Time
}

// rejectionLog keeps what guards reported: counts per scope over the last
// rejectionWindow and the most recent examples. It is in memory only, on
// the leader. It is safe for concurrent use.
type rejectionLog struct {
	mu      sync.Mutex
	scopes  map[string]*scopeRejections
	recent  []rejection // newest last, at most recentRejections
	dropped uint64      // reported as dropped by guards
}

type scopeRejections struct {
	buckets [rejectionBuckets]uint64 // counts per bucket of the window
	starts  [rejectionBuckets]int64  // each bucket's start, in bucket units
	last    time.Time
	example rejection // the most recent
}

func newRejectionLog() *rejectionLog {
	return &rejectionLog{scopes: make(map[string]*scopeRejections)}
}

func bucketOf(t time.Time) int64 { return t.UnixNano() / int64(rejectionWindow/rejectionBuckets) }

func (l *rejectionLog) add(r rejection) {
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

// scopeCount is one scope's rejections within the window.
type scopeCount struct {
	Scope  string
	Count  uint64
	Last   rejection
	Guards []string
}

// summary returns the scopes with rejections within the window before now,
// most rejected first, and the recent examples, newest first.
func (l *rejectionLog) summary(now time.Time) ([]scopeCount, []rejection, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	since := bucketOf(now) - rejectionBuckets + 1
	var counts []scopeCount
	for name, sc := range l.scopes {
		var n uint64
		for i, b := range sc.buckets {
			if sc.starts[i] >= since {
				n += b
			}
		}
		if n > 0 {
			counts = append(counts, scopeCount{Scope: name, Count: n, Last: sc.example})
		}
	}
	slices.SortFunc(counts, func(a, b scopeCount) int {
		if a.Count != b.Count {
			return int(b.Count) - int(a.Count)
		}
		return b.Last.At.Compare(a.Last.At)
	})
	recent := slices.Clone(l.recent)
	slices.Reverse(recent)
	return counts, recent, l.dropped
}

func (l *rejectionLog) addDropped(n uint64) {
	l.mu.Lock()
	l.dropped += n
	l.mu.Unlock()
}

// ReportRejections implements fence.v1.LeaseService.ReportRejections.
func (s *Server) ReportRejections(ctx context.Context, req *connect.Request[fencev1.ReportRejectionsRequest]) (*connect.Response[fencev1.ReportRejectionsResponse], error) {
	m := req.Msg
	switch {
	case m.Guard == "" || len(m.Guard) > maxGuardName || !utf8.ValidString(m.Guard):
		return nil, wire.ToConnect(&fence.InvalidError{Field: "guard", Reason: fmt.Sprintf("want 1 to %d bytes of UTF-8, got %d bytes", maxGuardName, len(m.Guard))})
	case len(m.Rejections) > maxReport:
		return nil, wire.ToConnect(&fence.InvalidError{Field: "rejections", Reason: fmt.Sprintf("%d in one report, at most %d allowed", len(m.Rejections), maxReport)})
	}
	for i, r := range m.Rejections {
		if err := fence.ValidateScope(r.Scope); err != nil {
			return nil, wire.ToConnect(fmt.Errorf("rejection %d: %w", i, err))
		}
		if r.PresentedToken == 0 || r.PresentedToken > fence.MaxToken || r.HighestToken < r.PresentedToken || r.HighestToken > fence.MaxToken {
			return nil, wire.ToConnect(&fence.InvalidError{Field: fmt.Sprintf("rejections[%d]", i),
				Reason: fmt.Sprintf("presented token %d and highest token %d: want 1 ≤ presented ≤ highest ≤ %d", r.PresentedToken, r.HighestToken, uint64(fence.MaxToken))})
		}
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	now := time.Now()
	for _, r := range m.Rejections {
		at := now
		if r.Time != nil {
			at = r.Time.AsTime()
		}
		rj := rejection{Guard: m.Guard, Scope: r.Scope, Presented: r.PresentedToken, Highest: r.HighestToken,
			Holder: s.events.holder(r.Scope, r.PresentedToken), At: at}
		s.rejected.add(rj)
		s.metrics.rejected(rj)
		s.publish(leaseEvent{Kind: kindRejected, Scope: rj.Scope, Token: rj.Presented, Holder: rj.Holder, At: at, Current: rj.Highest, Guard: rj.Guard})
	}
	if m.Dropped > 0 {
		s.rejected.addDropped(m.Dropped)
		s.metrics.rejectionsDropped.Add(float64(m.Dropped))
	}
	return connect.NewResponse(&fencev1.ReportRejectionsResponse{}), nil
}
