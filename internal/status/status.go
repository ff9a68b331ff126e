// Package status serves fenced's status page for people: the node's view of
// the cluster, the leader's held leases, a timeline of recent transitions
// and stale rejections, and the lease events as server-sent events for the
// page's script. It reads what other packages keep and changes nothing.
package status

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/eventlog"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/lessor"
	"github.com/fence-dev/fence/internal/version"
)

// The status page's paths. The page and its cluster part describe the node
// asked; the leases part and the event stream are the leader's, and
// followers forward them.
const (
	ClusterPath = "/status/cluster"
	LeasesPath  = "/status/leases"
	EventsPath  = "/events"
)

const (
	// maxStatusLeases bounds the leases the page lists.
	maxStatusLeases = 500
	// timelineScopes and timelineEvents bound the timeline: the scopes
	// with the most recent transitions, and the last transitions of each.
	timelineScopes = 20
	timelineEvents = 8
	// sseKeepAlive is how often an idle event stream sends a comment, so
	// that proxies and browsers keep it open.
	sseKeepAlive = 15 * time.Second
	// sseBatch bounds the events read from the ring at a time.
	sseBatch = 256
)

// errNotReady answers the event stream while this node is not the serving
// leader; followers forward it.
var errNotReady = fmt.Errorf("%w: not ready (starting up, or not the leader); retry shortly", fence.ErrUnavailable)

// Node is the replica the page reads.
type Node interface {
	Read(f func(*fsm.State))
	LeaderID() string
	Term() uint64
}

// Config is where the page finds what it shows.
type Config struct {
	NodeID string
	Logger *slog.Logger
	Node   Node
	Lessor *lessor.Lessor
	Events *eventlog.Ring
	// Rejected is what guards reported.
	Rejected *eventlog.Rejections
	// Readiness says whether this node is ready and why, for people.
	Readiness func() (bool, string)
	// Cluster answers ClusterService.Status as this node would.
	Cluster func(ctx context.Context) (*fencev1.StatusResponse, error)
	// LeaderChange returns a channel closed at the next change of leader.
	LeaderChange func() <-chan struct{}
}

// Page serves the status page. Its methods are safe for concurrent use.
type Page struct{ cfg Config }

// New returns the page of cfg.
func New(cfg Config) *Page { return &Page{cfg: cfg} }

//go:embed web/status.html
var webFiles embed.FS

var statusTemplates = template.Must(template.New("status").Funcs(template.FuncMap{
	"dur":   func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"clock": func(t time.Time) string { return t.Local().Format("15:04:05.000") },
	"pct": func(left, ttl time.Duration) int {
		if ttl <= 0 {
			return 0
		}
		return int(100 * left / ttl)
	},
}).ParseFS(webFiles, "web/status.html"))

// clusterView is the cluster part of the page, from the node asked.
type clusterView struct {
	NodeID    string
	Version   string // the build this node runs
	Ready     bool
	Readiness string
	Leader    string
	Term      uint64
	Commit    uint64
	Applied   uint64
	Nodes     []*fencev1.Node
	Err       string
}

// leasesView is the leader's part of the page.
type leasesView struct {
	Serving   bool   // false: no serving leader here; the rest is empty
	Elsewhere string // when not serving: the leader known to lead, if any
	Leader    string // the node that rendered it
	Now       time.Time
	Leases    []leaseRow
	More      int // held leases beyond those listed
	Timeline  []scopeTimeline
	Counts    []eventlog.ScopeCount
	Recent    []eventlog.Rejection
	Dropped   uint64
}

type leaseRow struct {
	Scope, Holder string
	Lease         string // the lease ID's fingerprint: the ID renews and releases
	Token         uint64
	TTL, Left     time.Duration
	GrantedAt     time.Time
	Waiters       int
}

type scopeTimeline struct {
	Scope    string
	Events   []eventlog.Event
	Renewals int // renewals among its retained events, not shown one by one
}

// pageView is the whole page.
type pageView struct {
	Cluster clusterView
	Leases  leasesView
}

func (s *Page) clusterView(r *http.Request) clusterView {
	ready, reason := s.cfg.Readiness()
	v := clusterView{NodeID: s.cfg.NodeID, Version: version.Get().Short(), Ready: ready, Readiness: reason}
	m, err := s.cfg.Cluster(r.Context())
	if err != nil {
		v.Err = err.Error()
		return v
	}
	v.Leader, v.Term, v.Commit, v.Applied, v.Nodes = m.Leader, m.Term, m.CommitIndex, m.AppliedIndex, m.Nodes
	return v
}

func (s *Page) leasesView() leasesView {
	now := time.Now()
	v := leasesView{Serving: s.cfg.Lessor.Ready(), Leader: s.cfg.NodeID, Now: now}
	if !v.Serving {
		v.Elsewhere = s.cfg.Node.LeaderID()
		return v
	}
	var held []fsm.ScopeInfo
	total := 0
	s.cfg.Node.Read(func(st *fsm.State) {
		held = st.Held("", "", maxStatusLeases)
		total = st.HeldCount()
	})
	v.More = total - len(held)
	for _, in := range held {
		l := in.Lease
		row := leaseRow{Scope: in.Scope, Holder: l.Holder, Lease: l.ID.Fingerprint(), Token: l.Token, TTL: l.TTL,
			Left: s.cfg.Lessor.Left(in.Scope, l.Token, now), Waiters: in.Waiters}
		if l.GrantedAt != 0 {
			row.GrantedAt = time.Unix(0, l.GrantedAt)
		}
		v.Leases = append(v.Leases, row)
	}
	v.Timeline = s.timeline()
	v.Counts, v.Recent, v.Dropped = s.cfg.Rejected.Summary(now)
	if len(v.Counts) > timelineScopes {
		v.Counts = v.Counts[:timelineScopes]
	}
	if len(v.Recent) > 10 {
		v.Recent = v.Recent[:10]
	}
	return v
}

// timeline groups the retained events by scope, the scopes with the latest
// events first, renewals counted rather than listed.
func (s *Page) timeline() []scopeTimeline {
	events := s.cfg.Events.Recent("", eventlog.RingSize, nil)
	var out []scopeTimeline
	at := make(map[string]int)
	for i := len(events) - 1; i >= 0; i-- {
		e := events[i]
		j, ok := at[e.Scope]
		if !ok {
			if len(out) == timelineScopes {
				continue
			}
			j = len(out)
			at[e.Scope] = j
			out = append(out, scopeTimeline{Scope: e.Scope})
		}
		t := &out[j]
		if e.Kind == eventlog.Renewed {
			t.Renewals++
			continue
		}
		if len(t.Events) < timelineEvents {
			t.Events = append(t.Events, e)
		}
	}
	for i := range out {
		slices.Reverse(out[i].Events) // oldest first, left to right
	}
	return out
}

func (s *Page) render(w http.ResponseWriter, name string, data any) {
	var b bytes.Buffer
	if err := statusTemplates.ExecuteTemplate(&b, name, data); err != nil {
		s.cfg.Logger.Error("status page", "template", name, "err", err)
		http.Error(w, "fence: status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b.Bytes())
}

// ServeStatus serves the page. A follower renders its own view of the
// cluster and leaves the leases to the page's script, which fetches them
// from the leader through it.
func (s *Page) ServeStatus(w http.ResponseWriter, r *http.Request) {
	s.render(w, "page", pageView{Cluster: s.clusterView(r), Leases: s.leasesView()})
}

// ServeCluster serves the page's cluster part, for its script to refresh.
func (s *Page) ServeCluster(w http.ResponseWriter, r *http.Request) {
	s.render(w, "cluster", s.clusterView(r))
}

// ServeLeases serves the page's leases part, for its script to refresh.
func (s *Page) ServeLeases(w http.ResponseWriter, r *http.Request) {
	s.render(w, "leases", s.leasesView())
}

// ServeEvents streams the event ring as server-sent events, one "lease"
// event per lease event with its position as the event ID, so that a
// browser's EventSource resumes by itself after a reconnection. When it
// cannot, it sends a "missed" event and carries on from now.
func (s *Page) ServeEvents(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	if err := fence.ValidatePrefix(prefix); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !s.cfg.Lessor.Ready() {
		http.Error(w, errNotReady.Error(), http.StatusServiceUnavailable)
		return
	}
	gen := s.cfg.LeaderChange()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	term := s.cfg.Node.Term()
	pos := s.cfg.Events.Position(term)
	var missed bool
	if id, err := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64); err == nil {
		if err := s.cfg.Events.Start(id+1, term); err != nil {
			missed = true
		} else {
			pos = id + 1
		}
	}
	fmt.Fprint(w, ": fence lease events\nretry: 1000\n\n")
	if missed {
		fmt.Fprint(w, "event: missed\ndata: {}\n\n")
	}
	if rc.Flush() != nil {
		return
	}
	keepAlive := time.NewTicker(sseKeepAlive)
	defer keepAlive.Stop()
	for {
		events, next, changed, err := s.cfg.Events.Read(pos, prefix, sseBatch)
		if err != nil {
			return // the client reconnects, and hears of what it missed
		}
		pos = next
		if len(events) > 0 {
			for _, e := range events {
				b, _ := json.Marshal(sseEvent(e))
				fmt.Fprintf(w, "id: %d\nevent: lease\ndata: %s\n\n", e.Position, b)
			}
			if rc.Flush() != nil {
				return
			}
			continue
		}
		select {
		case <-changed:
		case <-keepAlive.C:
			fmt.Fprint(w, ": keep-alive\n\n")
			if rc.Flush() != nil {
				return
			}
		case <-gen:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// sseEvent is an event as the status page's script reads it.
func sseEvent(e eventlog.Event) map[string]any {
	return map[string]any{
		"position": strconv.FormatUint(e.Position, 10), "kind": e.Kind.String(), "scope": e.Scope,
		"token": strconv.FormatUint(e.Token, 10), "holder": e.Holder, "lease": e.LeaseID.Fingerprint(),
		"time": e.At.UTC().Format(time.RFC3339Nano), "current_token": strconv.FormatUint(e.Current, 10), "guard": e.Guard,
	}
}
