package server

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/fsm"
)

// The status page's paths. The page and its cluster part describe the node
// asked; the leases part and the event stream are the leader's, and
// followers forward them.
const (
	statusClusterPath = "/status/cluster"
	statusLeasesPath  = "/status/leases"
	eventsPath        = "/events"
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
)

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
	Counts    []scopeCount
	Recent    []rejection
	Dropped   uint64
}

type leaseRow struct {
	Scope, Holder, LeaseID string
	Token                  uint64
	TTL, Left              time.Duration
	GrantedAt              time.Time
	Waiters                int
}

type scopeTimeline struct {
	Scope    string
	Events   []leaseEvent
	Renewals int // renewals among its retained events, not shown one by one
}

// pageView is the whole page.
type pageView struct {
	Cluster clusterView
	Leases  leasesView
}

func (s *Server) clusterView(r *http.Request) clusterView {
	ready, reason := s.readiness()
	v := clusterView{NodeID: s.cfg.NodeID, Ready: ready, Readiness: reason}
	resp, err := cluster{s}.Status(r.Context(), connect.NewRequest(&fencev1.StatusRequest{}))
	if err != nil {
		v.Err = err.Error()
		return v
	}
	m := resp.Msg
	v.Leader, v.Term, v.Commit, v.Applied, v.Nodes = m.Leader, m.Term, m.CommitIndex, m.AppliedIndex, m.Nodes
	return v
}

func (s *Server) leasesView() leasesView {
	now := time.Now()
	v := leasesView{Serving: s.lessor.Ready(), Leader: s.cfg.NodeID, Now: now}
	if !v.Serving {
		v.Elsewhere = s.node.LeaderID()
		return v
	}
	var held []fsm.ScopeInfo
	total := 0
	s.node.Read(func(st *fsm.State) {
		held = st.Held("", "", maxStatusLeases)
		total = st.HeldCount()
	})
	v.More = total - len(held)
	for _, in := range held {
		l := in.Lease
		row := leaseRow{Scope: in.Scope, Holder: l.Holder, LeaseID: leaseIDPrefix(l.ID), Token: l.Token, TTL: l.TTL,
			Left: s.lessor.Left(in.Scope, l.Token, now), Waiters: in.Waiters}
		if l.GrantedAt != 0 {
			row.GrantedAt = time.Unix(0, l.GrantedAt)
		}
		v.Leases = append(v.Leases, row)
	}
	v.Timeline = s.timeline()
	v.Counts, v.Recent, v.Dropped = s.rejected.summary(now)
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
func (s *Server) timeline() []scopeTimeline {
	events := s.events.recent("", ringSize, nil)
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
		if e.Kind == kindRenewed {
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

func (s *Server) render(w http.ResponseWriter, name string, data any) {
	var b bytes.Buffer
	if err := statusTemplates.ExecuteTemplate(&b, name, data); err != nil {
		s.log.Error("status page", "template", name, "err", err)
		http.Error(w, "fence: status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b.Bytes())
}

// serveStatus serves the page. A follower renders its own view of the
// cluster and leaves the leases to the page's script, which fetches them
// from the leader through it.
func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	s.render(w, "page", pageView{Cluster: s.clusterView(r), Leases: s.leasesView()})
}

func (s *Server) serveStatusCluster(w http.ResponseWriter, r *http.Request) {
	s.render(w, "cluster", s.clusterView(r))
}

func (s *Server) serveStatusLeases(w http.ResponseWriter, r *http.Request) {
	s.render(w, "leases", s.leasesView())
}

// serveEvents streams the event ring as server-sent events, one "lease"
// event per lease event with its position as the event ID, so that a
// browser's EventSource resumes by itself after a reconnection. When it
// cannot, it sends a "missed" event and carries on from now.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	if err := fence.ValidatePrefix(prefix); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !s.lessor.Ready() {
		http.Error(w, errNotReady.Error(), http.StatusServiceUnavailable)
		return
	}
	gen := s.leaderGeneration()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	term := s.node.Term()
	pos := s.events.position(term)
	var missed bool
	if id, err := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64); err == nil {
		if err := s.events.start(id+1, term); err != nil {
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
		events, next, changed, err := s.events.read(pos, prefix, watchBatch)
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
func sseEvent(e leaseEvent) map[string]any {
	return map[string]any{
		"position": strconv.FormatUint(e.Position, 10), "kind": e.Kind.String(), "scope": e.Scope,
		"token": strconv.FormatUint(e.Token, 10), "holder": e.Holder, "lease_id_prefix": leaseIDPrefix(e.LeaseID),
		"time": e.At.UTC().Format(time.RFC3339Nano), "current_token": strconv.FormatUint(e.Current, 10), "guard": e.Guard,
	}
}

// kindClass is the CSS class of an event kind.
func (k eventKind) Class() string { return "k-" + strings.ReplaceAll(k.String(), " ", "-") }
