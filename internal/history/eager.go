package history

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// LateAccepted is check 5's anomaly: on a followed scope, a write the
// resource accepted longer after the service ended its lease than
// Options.LateBound allows.
const LateAccepted = "late-accepted"

// Eager measures, for one group of scopes, the window eager fencing
// closes: from the end of a lease, by the service's record, to the moment
// the resource's mark passed its token, after which the resource refuses
// it. Without a follower the mark passes it when the next holder is served;
// with one, when the follower records the closing token.
type Eager struct {
	Followed bool
	Scopes   []string
	Ends     int             // leases the service ended that the history records
	Windows  []time.Duration // one per end, sorted; an end still open when the run ended counts its length so far
	Open     int             // ends whose token the resource still accepted when the run ended
	Late     []time.Duration // writes accepted after their lease ended: how long after, sorted
	Marks    int             // advances of the resource's marks by a follower
}

// Quantile returns the q-quantile (0 < q ≤ 1) of the sorted durations ds,
// the smallest value with at least q of them at or below it; 0 for none.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// followed returns the scopes the run's parameters (the Meta event) say a
// follower advanced.
func followed(evs []Event) map[string]bool {
	m := map[string]bool{}
	for _, e := range evs {
		if e.Type != Meta {
			continue
		}
		var meta struct {
			Followed []string `json:"followed"`
		}
		if json.Unmarshal([]byte(e.Detail), &meta) == nil {
			for _, s := range meta.Followed {
				m[s] = true
			}
		}
	}
	return m
}

// checkEager measures the windows of the followed scopes and of the
// others, and is check 5 when o.LateBound is set.
func checkEager(r *Report, evs []Event, applied []Event, o Options) string {
	follow := followed(evs)
	var last int64
	ends := map[string][]Event{}
	for _, e := range evs {
		last = max(last, e.Mono)
		if e.Type == End && e.Scope != "" {
			ends[e.Scope] = append(ends[e.Scope], e)
		}
	}
	byScope := map[string][]Event{}
	for _, e := range applied {
		byScope[e.Scope] = append(byScope[e.Scope], e)
	}
	top := map[string][]uint64{} // per scope, the highest token of the log up to each entry, by time
	for scope, log := range byScope {
		slices.SortFunc(log, func(a, b Event) int { return cmp.Compare(a.Mono, b.Mono) })
		var hi uint64
		for _, a := range log {
			hi = max(hi, a.Token)
			top[scope] = append(top[scope], hi)
		}
	}
	groups := [2]*Eager{{}, {Followed: true}}
	for scope := range union(ends, byScope) {
		g := groups[0]
		if follow[scope] {
			g = groups[1]
		}
		g.Scopes = append(g.Scopes, scope)
		endOf := map[uint64]Event{}
		for _, e := range ends[scope] {
			if prev, ok := endOf[e.Token]; !ok || e.Mono < prev.Mono {
				endOf[e.Token] = e
			}
		}
		for _, e := range endOf {
			g.Ends++
			// The first entry of the resource's log above the ended token:
			// from then on the guard refuses it.
			passed := last
			if i, _ := slices.BinarySearch(top[scope], e.Token+1); i < len(top[scope]) {
				passed = byScope[scope][i].Mono
			} else {
				g.Open++
			}
			g.Windows = append(g.Windows, time.Duration(max(passed-e.Mono, 0)))
		}
		for _, a := range byScope[scope] {
			if a.F == Mark {
				g.Marks++
			}
			e, ok := endOf[a.Token]
			if a.F != Write || !ok || a.Mono <= e.Mono {
				continue
			}
			late := time.Duration(a.Mono - e.Mono)
			g.Late = append(g.Late, late)
			if g.Followed && o.LateBound > 0 && late > o.LateBound {
				r.add(5, LateAccepted, "%s: the resource applied %s with token %d %v after the service recorded its lease %s, beyond the bound %v",
					scope, a.Ref, a.Token, late.Round(time.Millisecond), e.F, o.LateBound)
			}
		}
	}
	for _, g := range groups {
		slices.Sort(g.Scopes)
		slices.Sort(g.Windows)
		slices.Sort(g.Late)
		if g.Ends > 0 || len(g.Scopes) > 0 {
			r.Eager = append(r.Eager, *g)
		}
	}
	return fmt.Sprintf("%d writes accepted after their lease ended on followed scopes, bound %v", len(groups[1].Late), o.LateBound)
}

func union[V any](a, b map[string]V) map[string]bool {
	m := map[string]bool{}
	for k := range a {
		m[k] = true
	}
	for k := range b {
		m[k] = true
	}
	return m
}

// writeEager prints the windows of each group.
func (r *Report) writeEager(w io.Writer) {
	if len(r.Eager) == 0 {
		return
	}
	fmt.Fprintln(w, "eager fencing: from the end of a lease (the service's record) to the resource's first refusal of its token:")
	for _, g := range r.Eager { // without a follower first
		name := "without a follower"
		if g.Followed {
			name = "with a follower"
		}
		fmt.Fprintf(w, "  %-18s (%s): %d leases ended, %d marks advanced by a follower", name, strings.Join(g.Scopes, ", "), g.Ends, g.Marks)
		if len(g.Windows) > 0 {
			fmt.Fprintf(w, "; window p50 %v, p90 %v, p99 %v, max %v", ms(Quantile(g.Windows, 0.5)), ms(Quantile(g.Windows, 0.9)),
				ms(Quantile(g.Windows, 0.99)), ms(g.Windows[len(g.Windows)-1]))
		}
		if g.Open > 0 {
			fmt.Fprintf(w, "; %d still open when the run ended (counted at their length so far)", g.Open)
		}
		fmt.Fprintf(w, "\n    writes accepted after their lease ended: %d", len(g.Late))
		if len(g.Late) > 0 {
			fmt.Fprintf(w, ", p50 %v and at most %v after", ms(Quantile(g.Late, 0.5)), ms(g.Late[len(g.Late)-1]))
		}
		fmt.Fprintln(w)
	}
}

func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}
