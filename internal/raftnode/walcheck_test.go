package raftnode

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// walWith writes entries 1 to n, one batch each, into a new raft-wal log
// of segments of size bytes, and returns its directory and segment files,
// oldest first.
func walWith(t *testing.T, n uint64, size int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	s, _, err := openLog(dir, LogWAL, size)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendUntil(t, s, 0, n); got != n {
		t.Fatalf("appended %d of %d entries", got, n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(logPath(dir, LogWAL), "*.wal"))
	slices.Sort(files)
	return dir, files
}

// flipIn changes the first byte of entry i's 200-byte payload in file.
func flipIn(t *testing.T, file string, i uint64) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, entry(i).Data)
	if at < 0 {
		t.Fatalf("entry %d is not in %s", i, file)
	}
	b[at] ^= 0x5a
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedBatchRefused: a byte flipped inside a batch that raft-wal does
// not check at open (any but the tail's last) makes the log refuse to
// open, naming the file. Before, the damaged entry was read back as if
// nothing had happened.
func TestDamagedBatchRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   func(files []string) string
		i    uint64
	}{
		{"tail, an earlier batch", func(f []string) string { return f[len(f)-1] }, 0},
		{"sealed segment", func(f []string) string { return f[0] }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, files := walWith(t, 600, 64<<10)
			if len(files) < 2 {
				t.Fatalf("%d segment files, want 2 or more", len(files))
			}
			file := tc.in(files)
			i := tc.i
			if i == 0 { // the tail's first entry
				s, _, err := openLog(dir, LogWAL, 64<<10)
				if err != nil {
					t.Fatal(err)
				}
				last, _ := s.LastIndex()
				s.Close()
				i = last - 5
			}
			flipIn(t, file, i)
			s, _, err := openLog(dir, LogWAL, 64<<10)
			if err == nil {
				var l raft.Log
				s.GetLog(i, &l)
				s.Close()
				t.Fatalf("the log opened with entry %d damaged (read back %v, want %v)", i, l.Data[:4], entry(i).Data[:4])
			}
			if !strings.Contains(err.Error(), filepath.Base(file)) || !strings.Contains(err.Error(), "checksum") {
				t.Errorf("the refusal %q does not name %s and its checksum", err, filepath.Base(file))
			}
		})
	}
}

// TestTornLastBatchDropped: the tail's last batch not matching its CRC is
// a write a crash tore; raft-wal drops it, and the log opens without it.
func TestTornLastBatchDropped(t *testing.T) {
	dir, files := walWith(t, 50, 64<<20)
	flipIn(t, files[len(files)-1], 50)
	checkReopens(t, dir, 64<<20, 49)
}
