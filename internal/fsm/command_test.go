package fsm

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fence-dev/fence"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cmd   Command
		field string // the InvalidError field; empty for a valid command
	}{
		{"acquire", acquire("a", 1), ""},
		{"acquire with everything", acquire("a/b.c_d-e", 1, wait, reqID("r"), at(5)), ""},
		{"acquire, empty holder", acquire("a", 1, func(c *Command) { c.Holder = "" }), ""},
		{"acquire, longest holder", acquire("a", 1, func(c *Command) { c.Holder = strings.Repeat("h", fence.MaxHolderLen) }), ""},
		{"acquire, longest request id", acquire("a", 1, reqID(strings.Repeat("r", MaxRequestIDLen))), ""},
		{"acquire, longest scope", acquire(strings.Repeat("s", fence.MaxScopeLen), 1), ""},
		{"release", release("a", 1), ""},
		{"cancel", cancel("a", 1), ""},
		{"expire", expire("a", 1), ""},
		{"expire at the maximum", expire("a", maxTok), ""},
		{"promote", promote, ""},
		{"expire many", Command{Op: OpExpireMany, Expiries: []Expiry{{"a", 1}, {"b", maxTok}, {"a", 2}}}, ""},
		{"expire many, the most", Command{Op: OpExpireMany, Expiries: slices.Repeat([]Expiry{{"a", 1}}, MaxExpireMany)}, ""},
		// Promote carries nothing; stray fields do not make it invalid.
		{"promote with stray fields", Command{Op: OpPromote, Scope: "../x", TTL: -1}, ""},

		{"acquire, empty scope", acquire("", 1), "scope"},
		{"acquire, scope too long", acquire(strings.Repeat("s", fence.MaxScopeLen+1), 1), "scope"},
		{"acquire, scope with ..", acquire("a/../b", 1), "scope"},
		{"acquire, holder too long", acquire("a", 1, func(c *Command) { c.Holder = strings.Repeat("h", fence.MaxHolderLen+1) }), "holder"},
		{"acquire, holder with a NUL", acquire("a", 1, func(c *Command) { c.Holder = "a\x00" }), "holder"},
		{"acquire, zero ttl", acquire("a", 1, func(c *Command) { c.TTL = 0 }), "ttl"},
		{"acquire, negative ttl", acquire("a", 1, func(c *Command) { c.TTL = -time.Nanosecond }), "ttl"},
		{"acquire, request id too long", acquire("a", 1, reqID(strings.Repeat("r", MaxRequestIDLen+1))), "request_id"},
		{"acquire, zero lease id", acquire("a", 1, noLeaseID), "lease_id"},
		{"release, zero lease id", release("a", 0), "lease_id"},
		{"release, bad scope", release("a b", 1), "scope"},
		{"cancel, zero lease id", cancel("a", 0), "lease_id"},
		{"cancel, bad scope", cancel("", 1), "scope"},
		{"expire, zero token", expire("a", 0), "token"},
		{"expire, bad scope", expire("a/", 1), "scope"},
		{"expire many, none", Command{Op: OpExpireMany}, "expiries"},
		{"expire many, too many", Command{Op: OpExpireMany, Expiries: slices.Repeat([]Expiry{{"a", 1}}, MaxExpireMany+1)}, "expiries"},
		{"expire many, a zero token", Command{Op: OpExpireMany, Expiries: []Expiry{{"a", 1}, {"b", 0}}}, "expiries[1].token"},
		{"expire many, a bad scope", Command{Op: OpExpireMany, Expiries: []Expiry{{"a/", 1}}}, "expiries[0].scope"},
		{"no op", Command{Scope: "a"}, "op"},
		{"unknown op", Command{Op: "renew", Scope: "a", LeaseID: lid(1)}, "op"},
	} {
		err := tc.cmd.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
			}
			continue
		}
		var ie *fence.InvalidError
		if !errors.Is(err, fence.ErrInvalid) || !errors.As(err, &ie) || ie.Field != tc.field {
			t.Errorf("%s: Validate() = %v, want an InvalidError for %q", tc.name, err, tc.field)
		}
	}
}

// TestCommandLogForm pins the log form: commands already in a replicated
// log must decode the same way in every later build.
func TestCommandLogForm(t *testing.T) {
	const id1, id2 = `"f0000000000000000000000000000001"`, `"f0000000000000000000000000000002"`
	for _, tc := range []struct {
		cmd  Command
		json string
	}{
		{acquire("a/b", 1, wait, reqID("r"), at(5)),
			`{"op":"acquire","scope":"a/b","lease_id":` + id1 + `,"holder":"w1","ttl":1000000000,"wait":true,"request_id":"r","at":5}`},
		{acquire("a", 2), `{"op":"acquire","scope":"a","lease_id":` + id2 + `,"holder":"w2","ttl":2000000000}`},
		{release("a", 2), `{"op":"release","scope":"a","lease_id":` + id2 + `}`},
		{expire("a", maxTok, at(-1)), `{"op":"expire","scope":"a","token":9223372036854775807,"at":-1}`},
		{cancel("a", 1), `{"op":"cancel","scope":"a","lease_id":` + id1 + `}`},
		{Command{Op: OpPromote, At: 5}, `{"op":"promote","at":5}`},
	} {
		if got := string(tc.cmd.Encode()); got != tc.json {
			t.Errorf("%s: Encode() =\n%s\nwant\n%s", tc.cmd.Op, got, tc.json)
		}
		got, err := DecodeCommand([]byte(tc.json))
		if err != nil {
			t.Errorf("DecodeCommand(%s): %v", tc.json, err)
			continue
		}
		if diff := cmp.Diff(tc.cmd, got); diff != "" {
			t.Errorf("DecodeCommand(%s) (-want +got):\n%s", tc.json, diff)
		}
	}
}

func TestCommandEncodingRoundTrips(t *testing.T) {
	for _, c := range []Command{
		acquire("a", 1, func(c *Command) { c.Holder = "Jürgen's <laptop> & \u2028 \U0001F600" }),
		acquire("a", 1, reqID("retry \"1\"\\\t\x00")),
		acquire("a", 1, func(c *Command) { c.TTL = time.Duration(1<<63 - 1) }),
		expire("a", 1<<53+1),
		{Op: OpPromote, At: -1 << 63},
	} {
		got, err := DecodeCommand(c.Encode())
		if err != nil {
			t.Errorf("DecodeCommand(%s): %v", c.Encode(), err)
			continue
		}
		if diff := cmp.Diff(c, got); diff != "" {
			t.Errorf("round trip of %s (-want +got):\n%s", c.Encode(), diff)
		}
	}
}

func TestDecodeCommandRejects(t *testing.T) {
	const id = `"f0000000000000000000000000000001"`
	for _, tc := range []struct {
		in      string
		invalid bool // refused by Validate, so the error wraps fence.ErrInvalid
	}{
		{``, false},
		{` `, false},
		{`{`, false},
		{`[]`, false},
		{`"promote"`, false},
		{`{"op":"promote","extra":1}`, false},
		{`{"op":"acquire","scope":"a","lease_id":"zz","ttl":1}`, false},
		{`{"op":"acquire","scope":"a","lease_id":` + id + `,"ttl":"1s"}`, false},
		{`{"op":"acquire","scope":"a","lease_id":` + id + `,"ttl":1.5}`, false},
		{`{"op":"acquire","scope":"a","lease_id":` + id + `,"ttl":9223372036854775808}`, false},
		{`{"op":"expire","scope":"a","token":-1}`, false},
		{`{"op":"expire","scope":"a","token":18446744073709551616}`, false},
		{`{"op":"promote"} {"op":"promote"}`, false},
		{`{"op":"promote"} x`, false},
		{`null`, false},
		{`{}`, false},
		{`{"op":"steal"}`, false},
		{`{"op":"acquire","scope":"a","lease_id":` + id + `}`, true},
		{`{"op":"acquire","scope":"a","ttl":1}`, true},
		{`{"op":"acquire","scope":"a","lease_id":"00000000000000000000000000000000","ttl":1}`, false}, // ParseLeaseID refuses the zero ID
		{`{"op":"expire","scope":"a"}`, true},
		{`{"op":"expire_many"}`, true},
		{`{"op":"expire_many","expiries":[{"scope":"a","token":1},{"scope":"b"}]}`, true},
		{`{"op":"expire_many","expiries":[{"scope":"a","token":1,"extra":1}]}`, false},
		{`{"op":"release","scope":"../a","lease_id":` + id + `}`, true},
	} {
		c, err := DecodeCommand([]byte(tc.in))
		if err == nil {
			t.Errorf("DecodeCommand(%s) = %+v, want an error", tc.in, c)
			continue
		}
		if !reflect.DeepEqual(c, Command{}) {
			t.Errorf("DecodeCommand(%s) returned %+v with its error", tc.in, c)
		}
		if tc.invalid && !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("DecodeCommand(%s) = %v, want it to wrap fence.ErrInvalid", tc.in, err)
		}
	}
	// Surrounding white space is not trailing data.
	if _, err := DecodeCommand([]byte(" \n{\"op\":\"promote\"}\n ")); err != nil {
		t.Errorf("white space around a command: %v", err)
	}
}

// TestDecodeCommandRejectsTrailingData: a log entry is exactly one command.
func TestDecodeCommandRejectsTrailingData(t *testing.T) {
	for _, in := range []string{
		`{"op":"promote"} {}`,
		`{"op":"promote"}x`,
		`{"op":"promote"}}`,
		`{"op":"promote"}]`,
		`{"op":"promote"} ] {"op":"steal"}`,
	} {
		if c, err := DecodeCommand([]byte(in)); err == nil {
			t.Errorf("DecodeCommand(%s) = %+v, want an error for the trailing data", in, c)
		}
	}
}

// TestValidateAcceptsOnlyWhatTheLogCarries: a command that Validate
// accepts is proposed as Encode() and applied by every replica as
// DecodeCommand of that, so the two must agree. Otherwise the leader's
// view of the command (say the request ID its waiter listens for) differs
// from what the replicas applied, and a state restored from a snapshot
// differs from the one that applied the command directly.
func TestValidateAcceptsOnlyWhatTheLogCarries(t *testing.T) {
	for _, c := range []Command{
		acquire("a", 1, reqID("\xff")),
		acquire("a", 1, reqID("retry-\xc3")),
		acquire("a", 1, reqID(strings.Repeat("\xfe", MaxRequestIDLen))),
	} {
		if c.Validate() != nil {
			continue // refusing it is a fine answer
		}
		got, err := DecodeCommand(c.Encode())
		if err != nil {
			t.Errorf("request ID %q: Validate accepts it but its log form does not decode: %v", c.RequestID, err)
			continue
		}
		if diff := cmp.Diff(c, got); diff != "" {
			t.Errorf("request ID %q: Validate accepts it but the log carries another command (-applied +replicated):\n%s", c.RequestID, diff)
		}
	}
}
