package fsm

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"pgregory.net/rapid"

	"github.com/fence-dev/fence"
)

// anyString draws short strings, some of them not UTF-8, which JSON
// changes and protobuf refuses.
var anyString = rapid.OneOf(rapid.SampledFrom([]string{"", "a", "orders/eu", "Jürgen's \u2028 laptop", "\xff", "retry-\xc3"}), rapid.StringN(0, 8, -1))

func drawCommand(t *rapid.T, depth int) Command {
	ops := []Op{OpAcquire, OpRelease, OpExpire, OpExpireMany, OpCancel, OpPromote, OpSetNode, OpForgetNode, OpAddKey, OpSetFormat, OpBatch, "renew", ""}
	c := Command{
		Op: rapid.SampledFrom(ops).Draw(t, "op"), Scope: anyString.Draw(t, "scope"), Holder: anyString.Draw(t, "holder"),
		TTL: time.Duration(rapid.Int64().Draw(t, "ttl")), Wait: rapid.Bool().Draw(t, "wait"), RequestID: anyString.Draw(t, "request"),
		Token: rapid.Uint64().Draw(t, "token"), At: rapid.Int64().Draw(t, "at"), Node: anyString.Draw(t, "node"), Addr: anyString.Draw(t, "addr"),
		KeyID: anyString.Draw(t, "key"), ActivateAt: rapid.Int64().Draw(t, "activate"), MaxWaiters: rapid.Int().Draw(t, "max waiters"),
		Seed: anyString.Draw(t, "seed"), Owner: anyString.Draw(t, "owner"), Format: rapid.IntRange(-1, LogFormat+1).Draw(t, "format"),
	}
	if rapid.Bool().Draw(t, "lease ID") {
		c.LeaseID = fence.NewLeaseID()
	}
	for range rapid.IntRange(0, 2).Draw(t, "expiries") {
		c.Expiries = append(c.Expiries, Expiry{Scope: anyString.Draw(t, "expiry scope"), Token: rapid.Uint64().Draw(t, "expiry token")})
	}
	if depth < 2 {
		for range rapid.IntRange(0, 3).Draw(t, "commands") {
			c.Commands = append(c.Commands, drawCommand(t, depth+1))
		}
	}
	return c
}

// TestBinaryDecodesAsJSON: from BinaryFormat on a command is written in
// protobuf, where it is written in JSON below it; every replica must
// apply either form alike, so the two must decode to the same command, or
// to errors of the same kind, whatever the command.
func TestBinaryDecodesAsJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawCommand(t, 0)
		for f := 1; f < BinaryFormat; f++ {
			if got := c.EncodeFor(f); string(got) != string(c.Encode()) {
				t.Fatalf("EncodeFor(%d) = %q, want the JSON form", f, got)
			}
		}
		jc, jerr := DecodeCommand(c.Encode())
		entry := c.EncodeFor(BinaryFormat)
		bc, berr := DecodeCommand(entry)
		if (jerr == nil) != (berr == nil) || errors.Is(jerr, ErrUnknownEntry) != errors.Is(berr, ErrUnknownEntry) ||
			errors.Is(jerr, fence.ErrInvalid) != errors.Is(berr, fence.ErrInvalid) {
			t.Fatalf("JSON form: %v; binary form: %v", jerr, berr)
		}
		if diff := cmp.Diff(jc, bc); diff != "" {
			t.Fatalf("the forms decode differently (-JSON +binary):\n%s", diff)
		}
		if jerr == nil && binaryCarries(c) && entry[0] != binaryMark {
			t.Fatalf("a command the log carries was written as %q, not in binary", entry)
		}
	})
}

// binaryCarries reports whether protobuf can carry c: every string UTF-8,
// every operation one this build knows.
func binaryCarries(c Command) bool {
	if !c.Op.known() {
		return false
	}
	for _, s := range []string{c.Scope, c.Holder, c.RequestID, c.Node, c.Addr, c.KeyID, c.Seed, c.Owner} {
		if !utf8.ValidString(s) {
			return false
		}
	}
	for _, e := range c.Expiries {
		if !utf8.ValidString(e.Scope) {
			return false
		}
	}
	for _, sub := range c.Commands {
		if !binaryCarries(sub) {
			return false
		}
	}
	return true
}

// TestBinaryEntryIsNotJSON: a build before BinaryFormat decodes every entry
// as JSON, so it must find a binary entry malformed and stop at it, not
// read it as some command.
func TestBinaryEntryIsNotJSON(t *testing.T) {
	entry := Command{Op: OpPromote}.EncodeFor(BinaryFormat)
	if json.Valid(entry) {
		t.Fatalf("binary entry %q is valid JSON", entry)
	}
}

// TestDecodeBinaryUnknownEntry: a binary entry with what this build does
// not write (a later build's field or operation, a malformed lease ID,
// truncated bytes) is an entry this build does not understand.
func TestDecodeBinaryUnknownEntry(t *testing.T) {
	acq := Command{Op: OpAcquire, Scope: "a", LeaseID: fence.NewLeaseID(), TTL: time.Second}
	ok := acq.EncodeFor(BinaryFormat)
	if _, err := DecodeCommand(ok); err != nil {
		t.Fatalf("the valid entry: %v", err)
	}
	unknownField := protowire.AppendVarint(protowire.AppendTag(append([]byte{}, ok...), 99, protowire.VarintType), 1)
	nested := Command{Op: OpBatch, Commands: []Command{acq}}.EncodeFor(BinaryFormat)
	sub := protowire.AppendVarint(protowire.AppendTag(acq.EncodeFor(BinaryFormat)[1:], 99, protowire.VarintType), 1)
	// A batch (operation 11) whose command (field 19) has field 99.
	nestedUnknown := protowire.AppendVarint(protowire.AppendTag([]byte{binaryMark}, 1, protowire.VarintType), 11)
	nestedUnknown = protowire.AppendBytes(protowire.AppendTag(nestedUnknown, 19, protowire.BytesType), sub)
	for name, in := range map[string][]byte{
		"unknown field":           unknownField,
		"unknown field in batch":  nestedUnknown,
		"unknown operation":       protowire.AppendVarint(protowire.AppendTag([]byte{binaryMark}, 1, protowire.VarintType), 99),
		"no operation":            {binaryMark},
		"lease ID of 5 bytes":     protowire.AppendBytes(protowire.AppendTag(append([]byte{}, ok...), 3, protowire.BytesType), []byte("short")),
		"truncated":               ok[:len(ok)-3],
		"truncated batch":         nested[:len(nested)-1],
		"set_format beyond build": Command{Op: OpSetFormat, Format: LogFormat + 1}.EncodeFor(BinaryFormat),
	} {
		if c, err := DecodeCommand(in); !errors.Is(err, ErrUnknownEntry) {
			t.Errorf("%s: DecodeCommand(%x) = %+v, %v; want ErrUnknownEntry", name, in, c, err)
		}
	}
	if _, err := DecodeCommand(nested); err != nil {
		t.Errorf("the valid batch: %v", err)
	}
}
