package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestLogWriterKeepsEveryLineInOrder: lines written at once by many
// goroutines all come out whole, each goroutine's in the order it wrote
// them, once Close returns.
func TestLogWriterKeepsEveryLineInOrder(t *testing.T) {
	var out syncBuffer
	w := newLogWriter(&out)
	const writers, lines = 16, 2000
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range lines {
				fmt.Fprintf(w, "g%d line %d %s\n", g, i, strings.Repeat("x", i%200))
			}
		})
	}
	wg.Wait()
	w.Close()
	next := make([]int, writers)
	n := 0
	for l := range strings.Lines(out.String()) {
		var g, i int
		if _, err := fmt.Sscanf(l, "g%d line %d", &g, &i); err != nil || g < 0 || g >= writers {
			t.Fatalf("line %d mangled: %q", n, l)
		}
		if want := fmt.Sprintf("g%d line %d %s\n", g, i, strings.Repeat("x", i%200)); l != want {
			t.Fatalf("line %d = %q, want %q", n, l, want)
		}
		if i != next[g] {
			t.Fatalf("writer %d: line %d came after line %d", g, i, next[g]-1)
		}
		next[g]++
		n++
	}
	if n != writers*lines {
		t.Fatalf("%d lines out, want %d", n, writers*lines)
	}
	fmt.Fprintln(w, "after close")
	if !strings.HasSuffix(out.String(), "after close\n") {
		t.Fatal("a line logged after Close was not written")
	}
}
