package raftnode

import (
	"fmt"
	"time"
)

// DefaultElectionTimeout is the election timeout of a Config that gives
// none: etcd's default, and Raft's heartbeat timeout of 500ms that fenced
// has always run with.
const DefaultElectionTimeout = time.Second

// MinElectionTimeout is the shortest election timeout: it gives Raft the
// shortest leader lease hashicorp/raft accepts, 5ms.
const MinElectionTimeout = 20 * time.Millisecond

// timeouts maps an election timeout, how long followers go without hearing
// from the leader before they elect another, onto hashicorp/raft's timers.
//
// A hashicorp/raft follower does not restart a timer at each heartbeat, as
// etcd's does: it checks on a timer of a random period between
// HeartbeatTimeout and twice that, which heartbeats do not reset, whether
// it has heard from the leader within the last HeartbeatTimeout, and
// campaigns at the first check that finds it has not. So it campaigns
// between one and three HeartbeatTimeouts after the leader's last
// heartbeat, 1.78 on average. And a follower that still knows the leader
// refuses its vote (and pre-vote) to a candidate, so the cluster elects
// once the later of the followers has given up on the leader. Raft's
// HeartbeatTimeout set to the election timeout would let followers wait
// about twice the election timeout on average, up to three times it.
//
// Half of it makes the election timeout true on average: a follower
// campaigns half to one and a half election timeouts after the leader's
// last heartbeat (0.89 of it on average), and with three nodes the later
// of the two followers about one election timeout after it. etcd, whose
// followers campaign a random one to two election timeouts after the last
// heartbeat, elects with the first of them, about 1.33 election timeouts
// after it. The flip side: a leader silent for more than half the
// election timeout (a pause, a stalled disk) may be replaced, where etcd's
// waits a whole one.
//
// A candidate waits Raft's ElectionTimeout, a random one to two times it,
// for votes before it tries again; with pre-vote (on by default) a split
// vote is rare, and that wait is not part of the detection: it is set to
// the heartbeat timeout, as fenced has always run. The leader steps down
// after LeaderLeaseTimeout without hearing from a quorum, which must not
// exceed HeartbeatTimeout: half of it, as before. No safety property
// depends on these timers, only how soon a dead leader is replaced
// (docs/safety.md).
//
// The default, a second, thus gives Raft the timers of fenced's earlier
// default election timeout of 500ms: HeartbeatTimeout and ElectionTimeout
// 500ms, LeaderLeaseTimeout 250ms.
func timeouts(election time.Duration) (heartbeat, candidate, lease time.Duration) {
	heartbeat = election / 2
	return heartbeat, heartbeat, heartbeat / 2
}

// CheckElectionTimeout returns an error for an election timeout that is
// neither zero (the default) nor at least MinElectionTimeout.
func CheckElectionTimeout(d time.Duration) error {
	if d != 0 && d < MinElectionTimeout {
		return fmt.Errorf("election timeout %v is too short: want %v or more (0 for the default, %v)", d, MinElectionTimeout, DefaultElectionTimeout)
	}
	return nil
}
