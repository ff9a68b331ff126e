package fsm

import (
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

// BenchmarkHeldPage lists a page of 100 held scopes from the middle of a
// state holding 100,000: what a List call or a refresh of the status page
// costs the state's lock.
func BenchmarkHeldPage(b *testing.B) {
	s := New()
	const n = 100_000
	for i := range n {
		r := s.Apply(Command{Op: OpAcquire, Scope: fmt.Sprintf("scope/%06d", i), LeaseID: fence.NewLeaseID(), TTL: time.Minute})
		if r.Outcome != Granted {
			b.Fatal(r.Outcome)
		}
	}
	after := fmt.Sprintf("scope/%06d", n/2)
	for b.Loop() {
		if page := s.Held("scope/", after, 100); len(page) != 100 {
			b.Fatalf("%d scopes", len(page))
		}
	}
}

// BenchmarkSnapshot takes a snapshot of a state holding 100,000 leases:
// Freeze runs on Raft's goroutine that applies commands, so applies wait
// that long; WriteTo runs on Raft's snapshot goroutine meanwhile.
func BenchmarkSnapshot(b *testing.B) {
	s := New()
	for i := range 100_000 {
		s.Apply(Command{Op: OpAcquire, Scope: fmt.Sprintf("scope/%06d", i), Holder: "bench-holder", RequestID: fmt.Sprintf("%032x", i), LeaseID: fence.NewLeaseID(), TTL: time.Minute, At: 1})
	}
	b.Run("Freeze", func(b *testing.B) {
		for b.Loop() {
			s.Freeze()
		}
	})
	b.Run("WriteTo", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			f := s.Freeze()
			b.StartTimer()
			if n, err := f.WriteTo(io.Discard); err != nil || n == 0 {
				b.Fatalf("snapshot of %d bytes: %v", n, err)
			}
		}
	})
}

// BenchmarkHeldLeaseBytes reports the heap a held lease costs the state
// (bytes/lease): 100,000 scopes each granted once, as a service holding
// many leases has them, by 64 holders, each with a request ID of its own.
// Each command's strings are its own, as decoding it from the log makes
// them, and count if the state keeps them.
func BenchmarkHeldLeaseBytes(b *testing.B) {
	const n = 100_000
	var per float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := New()
		for i := range n {
			s.Apply(Command{Op: OpAcquire, Scope: fmt.Sprintf("scale/%07d", i), Holder: fmt.Sprintf("holder-%d", i%64),
				RequestID: fmt.Sprintf("%032x", i), LeaseID: fence.NewLeaseID(), TTL: time.Hour, At: 1})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(per, "bytes/lease")
}

// BenchmarkDecodeBatch decodes the entry of a batch of 24 acquires, as a
// busy leader's clients send them, in each form: the state machine's
// goroutine decodes every entry before it applies it.
func BenchmarkDecodeBatch(b *testing.B) {
	batch := benchBatch()
	for _, format := range []int{BinaryFormat - 1, BinaryFormat} {
		entry := batch.EncodeFor(format)
		b.Run(fmt.Sprintf("format=%d", format), func(b *testing.B) {
			for b.Loop() {
				if _, err := DecodeCommand(entry); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(entry)), "bytes/entry")
		})
	}
}

// BenchmarkEncodeBatch encodes that entry, as the leader does for each
// batch it proposes.
func BenchmarkEncodeBatch(b *testing.B) {
	batch := benchBatch()
	for _, format := range []int{BinaryFormat - 1, BinaryFormat} {
		b.Run(fmt.Sprintf("format=%d", format), func(b *testing.B) {
			for b.Loop() {
				batch.EncodeFor(format)
			}
		})
	}
}

// benchBatch is a batch of 24 acquires, as a busy leader's clients send
// them.
func benchBatch() Command {
	var cs []Command
	for i := range 24 {
		cs = append(cs, Command{Op: OpAcquire, Scope: fmt.Sprintf("bench/scope-%d", i), LeaseID: fence.NewLeaseID(),
			Holder: "worker@host-17", TTL: 10 * time.Second, RequestID: fmt.Sprintf("req-%016x", i), At: time.Now().UnixNano()})
	}
	return Command{Op: OpBatch, Commands: cs}
}
