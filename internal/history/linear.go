package history

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// regInput is a register operation as the model sees it.
type regInput struct {
	write bool
	from  string // write: the value it replaces
	to    string // write: the value it sets
	id    string
}

// regOutput is what the operation returned.
type regOutput struct {
	value   string // read: the value read
	unknown bool   // write: the outcome is unknown
}

// registerModel is one scope's register under read-modify-write. A read
// returns the current value. A write replaces the value it read (from) by
// its own (to): it is legal only where the register still holds from,
// which is what the fence guarantees of an accepted write, since any newer
// holder's request refuses it. A write of unknown outcome may have taken
// effect or not. The state is the register's value; "" before any write.
var registerModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{""} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(string), input.(regInput), output.(regOutput)
		if !in.write {
			if out.value == s {
				return []any{s}
			}
			return nil
		}
		var next []any
		if out.unknown {
			next = append(next, s)
		}
		if s == in.from {
			next = append(next, in.to)
		}
		return next
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		if !in.write {
			return fmt.Sprintf("%s read -> %q", in.id, out.value)
		}
		s := fmt.Sprintf("%s write %q -> %q", in.id, in.from, in.to)
		if out.unknown {
			s += " (outcome unknown)"
		}
		return s
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%q", state) },
}

// checkLinearizable is check 3: per scope, porcupine searches for an order
// of the acknowledged reads, the acknowledged writes and the writes of
// unknown outcome that respects real time and the register model. Reads
// and writes that certainly had no effect (refused as stale, failed) are
// left out, as are reads of unknown outcome. The final value, read after
// every process stopped, closes each scope's history.
func checkLinearizable(r *Report, ops []Op, finals map[string]Event, o Options) string {
	byScope := map[string][]porcupine.Operation{}
	clients := map[string]int{}
	client := func(proc string) int {
		if id, ok := clients[proc]; ok {
			return id
		}
		clients[proc] = len(clients)
		return clients[proc]
	}
	for _, op := range ops {
		c, res := op.Call, op.Result
		var in regInput
		var out regOutput
		ret := res.Mono
		switch {
		case c.F == Read && res.Type == OK:
			out.value = res.Value
		case c.F == Write && res.Type == OK:
			in = regInput{write: true, from: c.From, to: c.Value}
		case c.F == Write && res.Type == Info:
			in = regInput{write: true, from: c.From, to: c.Value}
			out.unknown = true
			ret = infinity
		default:
			continue
		}
		in.id = c.ID()
		byScope[c.Scope] = append(byScope[c.Scope], porcupine.Operation{
			ClientId: client(c.Proc), Input: in, Call: c.Mono, Output: out, Return: ret,
		})
	}
	for scope, f := range finals {
		byScope[scope] = append(byScope[scope], porcupine.Operation{
			ClientId: client("checker"), Input: regInput{id: "final"}, Call: f.Mono, Output: regOutput{value: f.Value}, Return: f.Mono,
		})
	}
	model := registerModel.ToModel()
	n := 0
	for _, scope := range slices.Sorted(maps.Keys(byScope)) {
		h := byScope[scope]
		n += len(h)
		res, info := porcupine.CheckOperationsVerbose(model, h, o.LinearizabilityTimeout)
		switch res {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			r.add(3, Undecided, "%s: the search for a linearization of %d operations did not finish within %v", scope, len(h), o.LinearizabilityTimeout)
			continue
		}
		where := ""
		if o.VisualizeDir != "" {
			path := filepath.Join(o.VisualizeDir, "linearizability-"+strings.ReplaceAll(scope, "/", "_")+".html")
			if err := porcupine.VisualizePath(model, info, path); err == nil {
				where = "; see " + path
			} else {
				fmt.Fprintln(os.Stderr, "fencecheck: visualise:", err)
			}
		}
		r.add(3, NotLinearizable, "%s: no order of its %d reads and writes fits a register%s%s", scope, len(h), longestPrefix(info), where)
	}
	return fmt.Sprintf("%d reads and writes of %d scopes", n, len(byScope))
}

// longestPrefix describes where the longest partial linearization stops.
func longestPrefix(info porcupine.LinearizationInfo) string {
	var best []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) > len(best) {
				best = lin
			}
		}
	}
	if len(best) == 0 {
		return ""
	}
	last := best[len(best)-1]
	return fmt.Sprintf(" (the longest linearizable prefix has %d operations and ends with %s)", len(best),
		registerModel.DescribeOperation(last.Input, last.Output))
}
