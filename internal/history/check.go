package history

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"time"
)

// Anomaly kinds, grouped by the check that finds them.
const (
	// Check 1: the fencing rule at the resource.
	StaleAccepted = "stale-accepted" // a fenced request was applied with a token lower than one already applied
	// Check 2: grant tokens.
	DuplicateGrant = "duplicate-grant" // two grants of one scope carried the same token
	GrantOrder     = "grant-order"     // a grant that began after another ended got a token no greater
	GrantLost      = "grant-lost"      // the service's last token is below a token it granted
	// Check 3: linearizability of the register.
	NotLinearizable = "not-linearizable" // no order of the operations explains what was read and written
	Undecided       = "linearizability-undecided"
	// Check 4: acknowledged writes.
	LostWrite        = "lost-write"        // an acknowledged write is not in the register's final chain of values
	UnexplainedValue = "unexplained-value" // the register holds a value no write of the history wrote
)

// Options tunes Check.
type Options struct {
	// LinearizabilityTimeout bounds the linearizability search of each run
	// (default one minute); past it the check reports Undecided.
	LinearizabilityTimeout time.Duration
	// VisualizeDir, if set, receives an HTML visualisation of each scope
	// whose history is not linearizable.
	VisualizeDir string
	// LateBound, if set, makes check 5 of it: on a followed scope, a write
	// accepted longer than this after the service ended its lease is an
	// anomaly (LateAccepted). Unset, the windows are measured only.
	LateBound time.Duration
}

// Op is one operation: an invocation and its completion.
type Op struct {
	Call   Event
	Result Event // Type is OK, Fail or Info; Info with Mono 0 if it never completed
}

// Report is the outcome of Check.
type Report struct {
	Ops       map[string]map[Type]int // per operation name, per outcome
	Stale     int                     // reads and writes refused as stale
	Accepted  int                     // reads and writes that took effect
	Unknown   int                     // reads and writes of unknown outcome
	Faults    map[string]int          // faults injected, per kind
	Scopes    int
	Grants    int
	Applied   int // entries of the resource's log
	Anomalies []Anomaly
	Checks    []CheckResult
	Eager     []Eager // the window eager fencing closes, without and with a follower
}

// Anomaly is one violation found.
type Anomaly struct {
	Kind    string
	Check   int // 1 to 5
	Example string
}

// CheckResult summarises one of the checks.
type CheckResult struct {
	N       int
	Name    string
	Checked string // what was checked, for the summary line
	Found   int
}

// Count returns the number of anomalies.
func (r *Report) Count() int { return len(r.Anomalies) }

func (r *Report) add(check int, kind, format string, args ...any) {
	r.Anomalies = append(r.Anomalies, Anomaly{Kind: kind, Check: check, Example: fmt.Sprintf(format, args...)})
}

// Pair groups a history's invocations with their completions, in
// invocation order. An invocation without a completion (its process was
// killed) gets an Info result with Mono 0.
func Pair(evs []Event) []Op {
	type key struct {
		proc string
		op   int64
	}
	open := map[key]int{}
	var ops []Op
	for _, e := range evs {
		k := key{e.Proc, e.Op}
		switch e.Type {
		case Invoke:
			open[k] = len(ops)
			ops = append(ops, Op{Call: e})
		case OK, Fail, Info:
			if i, ok := open[k]; ok {
				ops[i].Result = e
				delete(open, k)
			}
		}
	}
	for _, i := range open {
		ops[i].Result = Event{Type: Info, Proc: ops[i].Call.Proc, Op: ops[i].Call.Op, Reason: "no completion recorded"}
	}
	slices.SortStableFunc(ops, func(a, b Op) int { return cmp.Compare(a.Call.Mono, b.Call.Mono) })
	return ops
}

// Check runs the four checks over a history, measures the window eager
// fencing closes, and, with Options.LateBound, checks it (check 5).
func Check(evs []Event, o Options) *Report {
	if o.LinearizabilityTimeout == 0 {
		o.LinearizabilityTimeout = time.Minute
	}
	r := &Report{Ops: map[string]map[Type]int{}, Faults: map[string]int{}}
	ops := Pair(evs)
	scopes := map[string]bool{}
	var applied []Event
	finals := map[string]Event{}
	for _, e := range evs {
		switch e.Type {
		case Fault:
			r.Faults[e.F]++
		case Applied:
			applied = append(applied, e)
		case Final:
			finals[e.Scope] = e
		}
	}
	for _, op := range ops {
		f := op.Call.F
		if r.Ops[f] == nil {
			r.Ops[f] = map[Type]int{}
		}
		r.Ops[f][op.Result.Type]++
		if op.Call.Scope != "" {
			scopes[op.Call.Scope] = true
		}
		if f != Read && f != Write {
			continue
		}
		switch {
		case op.Result.Type == OK:
			r.Accepted++
		case op.Result.Type == Fail && op.Result.Reason == ReasonStale:
			r.Stale++
		case op.Result.Type == Info:
			r.Unknown++
		}
	}
	r.Scopes = len(scopes)
	r.Applied = len(applied)

	n := len(r.Anomalies)
	checked := checkStale(r, ops, applied)
	r.Checks = append(r.Checks, CheckResult{1, "no fenced request applied with a token below one already applied", checked, len(r.Anomalies) - n})
	n = len(r.Anomalies)
	checked = checkGrants(r, ops, finals)
	r.Checks = append(r.Checks, CheckResult{2, "grant tokens unique and increasing per scope", checked, len(r.Anomalies) - n})
	n = len(r.Anomalies)
	checked = checkLinearizable(r, ops, finals, o)
	r.Checks = append(r.Checks, CheckResult{3, "the register is linearizable", checked, len(r.Anomalies) - n})
	n = len(r.Anomalies)
	checked = checkLost(r, ops, applied, finals)
	r.Checks = append(r.Checks, CheckResult{4, "no acknowledged write lost", checked, len(r.Anomalies) - n})
	n = len(r.Anomalies)
	checked = checkEager(r, evs, applied, o)
	if o.LateBound > 0 {
		r.Checks = append(r.Checks, CheckResult{5, "no write accepted on a followed scope longer than the bound after its lease ended", checked, len(r.Anomalies) - n})
	}
	return r
}

// checkStale is check 1, on two sources. The resource's own log gives the
// order in which it applied requests: along it, per scope, a token may
// never fall. The workers' history gives real time: a request acknowledged
// as applied may not carry a token lower than one whose acknowledgement
// came before it was sent.
func checkStale(r *Report, ops []Op, applied []Event) string {
	flagged := map[string]bool{}
	byScope := map[string][]Event{}
	for _, e := range applied {
		byScope[e.Scope] = append(byScope[e.Scope], e)
	}
	for _, scope := range slices.Sorted(maps.Keys(byScope)) {
		log := byScope[scope]
		slices.SortFunc(log, func(a, b Event) int { return cmp.Compare(a.Index, b.Index) })
		var top Event
		for _, e := range log {
			if e.Token < top.Token {
				flagged[e.Ref] = true
				r.add(1, StaleAccepted, "%s: the resource applied %s %s with token %d at index %d, after %s with token %d at index %d",
					scope, e.Ref, e.F, e.Token, e.Index, top.Ref, top.Token, top.Index)
			}
			if e.Token >= top.Token {
				top = e
			}
		}
	}
	acked := map[string][]Op{}
	for _, op := range ops {
		if (op.Call.F == Read || op.Call.F == Write) && op.Result.Type == OK {
			acked[op.Call.Scope] = append(acked[op.Call.Scope], op)
		}
	}
	for _, scope := range slices.Sorted(maps.Keys(acked)) {
		forEachOverlapFree(acked[scope], func(before, op Op) bool {
			if op.Call.Token >= before.Call.Token || flagged[op.Call.ID()] {
				return false
			}
			flagged[op.Call.ID()] = true
			r.add(1, StaleAccepted, "%s: %s %s with token %d was acknowledged, but was sent after %s with token %d had been acknowledged",
				scope, op.Call.ID(), op.Call.F, op.Call.Token, before.Call.ID(), before.Call.Token)
			return true
		})
	}
	return fmt.Sprintf("%d requests in the resource's log, %d acknowledged to the workers", len(applied), countAll(acked))
}

func countAll(m map[string][]Op) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// forEachOverlapFree calls f(before, op) for each op of ops with the
// completed operation of greatest token whose completion precedes op's
// invocation, if there is one.
func forEachOverlapFree(ops []Op, f func(before, op Op) bool) {
	done := slices.Clone(ops)
	slices.SortFunc(done, func(a, b Op) int { return cmp.Compare(a.Result.Mono, b.Result.Mono) })
	best := make([]int, len(done)) // best[i]: index in done of the max token among done[:i+1]
	for i := range done {
		best[i] = i
		if i > 0 && done[best[i-1]].Call.Token >= done[i].Call.Token {
			best[i] = best[i-1]
		}
	}
	for _, op := range ops {
		// the completed operations strictly before op's invocation
		k := sort.Search(len(done), func(i int) bool { return done[i].Result.Mono >= op.Call.Mono })
		if k > 0 {
			f(done[best[k-1]], op)
		}
	}
}

// checkGrants is check 2: per scope, every granted token is unique, a grant
// invoked after another completed has a greater token, and the service
// still counts at least the greatest granted token after the run.
func checkGrants(r *Report, ops []Op, finals map[string]Event) string {
	grants := map[string][]Op{}
	for _, op := range ops {
		if op.Call.F == Acquire && op.Result.Type == OK {
			grants[op.Call.Scope] = append(grants[op.Call.Scope], op)
			r.Grants++
		}
	}
	for _, scope := range slices.Sorted(maps.Keys(grants)) {
		gs := grants[scope]
		seen := map[uint64]Op{}
		var top uint64
		for _, g := range gs {
			t := g.Result.Token
			top = max(top, t)
			if prev, dup := seen[t]; dup {
				r.add(2, DuplicateGrant, "%s: token %d granted to %s and again to %s", scope, t, prev.Call.ID(), g.Call.ID())
				continue
			}
			seen[t] = g
		}
		done := slices.Clone(gs)
		for i := range done {
			done[i].Call.Token = done[i].Result.Token // forEachOverlapFree compares Call.Token
		}
		forEachOverlapFree(done, func(before, g Op) bool {
			if g.Call.Token >= before.Call.Token { // equal tokens are reported as duplicates
				return false
			}
			r.add(2, GrantOrder, "%s: %s was granted token %d after %s had been granted token %d", scope, g.Call.ID(), g.Call.Token, before.Call.ID(), before.Call.Token)
			return true
		})
		if f, ok := finals[scope]; ok && f.Token < top {
			r.add(2, GrantLost, "%s: the service's last token is %d after the run, but it granted token %d", scope, f.Token, top)
		}
	}
	return fmt.Sprintf("%d grants of %d scopes", r.Grants, len(grants))
}

// checkLost is check 4. The register's values form a chain: each written
// value names its write, and each write names the value it replaced.
// Walking back from the final value gives every write that survives; an
// acknowledged write off that chain was lost. The resource's log must also
// hold every acknowledged request.
func checkLost(r *Report, ops []Op, applied []Event, finals map[string]Event) string {
	byValue := map[string]Op{}
	acked := map[string][]Op{}
	for _, op := range ops {
		if op.Call.F != Write {
			continue
		}
		byValue[op.Call.Value] = op
		if op.Result.Type == OK {
			acked[op.Call.Scope] = append(acked[op.Call.Scope], op)
		}
	}
	inLog := map[string]bool{}
	for _, e := range applied {
		inLog[e.Ref] = true
	}
	total := 0
	scopes := slices.Sorted(maps.Keys(acked))
	for scope := range finals {
		if acked[scope] == nil {
			scopes = append(scopes, scope)
		}
	}
	for _, scope := range scopes {
		total += len(acked[scope])
		f, ok := finals[scope]
		if !ok {
			continue
		}
		chain := map[string]bool{}
		v := f.Value
		for steps := 0; v != "" && steps <= len(byValue); steps++ {
			w, ok := byValue[v]
			if !ok || w.Call.Scope != scope {
				r.add(4, UnexplainedValue, "%s: the register holds %q, which no write of this scope in the history wrote", scope, v)
				break
			}
			chain[w.Call.ID()] = true
			v = w.Call.From
		}
		for _, w := range acked[scope] {
			switch {
			case !chain[w.Call.ID()]:
				r.add(4, LostWrite, "%s: %s wrote %q (replacing %q) with token %d and was acknowledged, but the final value %q does not descend from it",
					scope, w.Call.ID(), w.Call.Value, w.Call.From, w.Call.Token, f.Value)
			case len(applied) > 0 && !inLog[w.Call.ID()]:
				r.add(4, LostWrite, "%s: %s was acknowledged, but the resource's log has no record of it", scope, w.Call.ID())
			}
		}
	}
	return fmt.Sprintf("%d acknowledged writes against %d final values", total, len(finals))
}

// Write prints the report for a person, ending with the line
// "anomalies: N".
func (r *Report) Write(w io.Writer) {
	fmt.Fprintln(w, "faults injected:")
	if len(r.Faults) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, k := range slices.Sorted(maps.Keys(r.Faults)) {
		fmt.Fprintf(w, "  %-15s %d\n", k, r.Faults[k])
	}
	total := 0
	for _, m := range r.Ops {
		for _, n := range m {
			total += n
		}
	}
	fmt.Fprintf(w, "operations: %d over %d scopes\n", total, r.Scopes)
	for _, f := range []string{Acquire, Renew, Read, Write, Release} {
		m := r.Ops[f]
		if m == nil {
			continue
		}
		fmt.Fprintf(w, "  %-8s ok %d, failed %d, unknown %d\n", f, m[OK], m[Fail], m[Info])
	}
	fmt.Fprintf(w, "reads and writes: accepted %d, rejected as stale %d, unknown outcome %d; resource log %d entries\n", r.Accepted, r.Stale, r.Unknown, r.Applied)
	r.writeEager(w)
	fmt.Fprintln(w, "checks:")
	for _, c := range r.Checks {
		verdict := "ok"
		if c.Found > 0 {
			verdict = fmt.Sprintf("FAILED, %d anomalies", c.Found)
		}
		fmt.Fprintf(w, "  %d. %s: %s (%s)\n", c.N, c.Name, verdict, c.Checked)
	}
	if len(r.Anomalies) > 0 {
		fmt.Fprintln(w, "anomalies by kind (first example):")
		kinds := map[string][]Anomaly{}
		for _, a := range r.Anomalies {
			kinds[a.Kind] = append(kinds[a.Kind], a)
		}
		for _, k := range slices.Sorted(maps.Keys(kinds)) {
			as := kinds[k]
			fmt.Fprintf(w, "  %-26s %4d  %s\n", k, len(as), as[0].Example)
		}
	}
	fmt.Fprintf(w, "anomalies: %d\n", len(r.Anomalies))
}

// Kinds returns the number of anomalies of each kind.
func (r *Report) Kinds() map[string]int {
	m := map[string]int{}
	for _, a := range r.Anomalies {
		m[a.Kind]++
	}
	return m
}

// infinity is the return time of an operation that never returned.
const infinity = math.MaxInt64
