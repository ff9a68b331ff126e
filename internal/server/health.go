package server

import (
	"fmt"
	"net/http"
)

// serveHealthz answers 200 while the process serves HTTP at all: a
// liveness probe. It checks nothing else, so that a node that is merely
// cut off from its peers is not restarted for it.
func (s *Server) serveHealthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// serveReadyz answers 200 when this node can serve the API: it is the
// leader and has taken office, or it follows a leader whose API address it
// knows and has applied every entry it knows to be committed. Otherwise it
// answers 503 with the reason: a readiness probe.
func (s *Server) serveReadyz(w http.ResponseWriter, r *http.Request) {
	ok, reason := s.readiness()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprintln(w, reason)
}

// readiness says whether this node is ready and why, for people.
func (s *Server) readiness() (bool, string) {
	st := s.node.Stats()
	if err := s.disk.err(); err != nil {
		return false, "not ready: " + err.Error()
	}
	switch {
	case s.lessor.Ready():
		return true, fmt.Sprintf("ready: leader %s in term %d", s.cfg.NodeID, st.Term)
	case st.Leader:
		return false, fmt.Sprintf("not ready: leader %s is taking office (applying its log, extending leases)", s.cfg.NodeID)
	case st.LeaderID == "":
		return false, "not ready: no leader known (an election is under way, or this node cannot reach a quorum or has not joined yet)"
	case st.AppliedIndex < st.CommitIndex:
		return false, fmt.Sprintf("not ready: applied index %d is behind commit index %d", st.AppliedIndex, st.CommitIndex)
	case s.leaderAPI() == "":
		return false, fmt.Sprintf("not ready: the API address of leader %s is not known yet, so requests cannot be forwarded", st.LeaderID)
	}
	return true, fmt.Sprintf("ready: follower of %s in term %d, applied index %d", st.LeaderID, st.Term, st.AppliedIndex)
}
