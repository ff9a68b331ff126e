//go:build unix

package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestBackupRestore saves a backup of a running fenced, lets it grant on,
// and starts a new fenced from the backup: the lease the backup holds is
// held again with its token, and the next token is above every token the
// first service granted, after the backup included. The file is its
// owner's only: it holds lease IDs and signing keys.
func TestBackupRestore(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	var kept leaseOutput
	s.wantJSON(t, 0, &kept, "acquire", "kept", "--ttl", "1m")
	var highest uint64
	grant := func(s *fenced) uint64 {
		t.Helper()
		var l leaseOutput
		s.wantJSON(t, 0, &l, "acquire", "orders", "--ttl", "1m")
		s.want(t, 0, "release", "orders", "--lease", l.LeaseID)
		return l.Token
	}
	for range 3 {
		highest = max(highest, grant(s))
	}
	file := filepath.Join(t.TempDir(), "fence.backup")
	var out struct {
		File  string `json:"file"`
		Bytes int64  `json:"bytes,string"` // a 64-bit integer: a string, as in the API's JSON
	}
	s.wantJSON(t, 0, &out, "backup", file)
	fi, err := os.Stat(file)
	if err != nil || fi.Size() != out.Bytes || out.Bytes == 0 {
		t.Fatalf("backup wrote %+v; the file: %v, %v", out, fi, err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the backup file's mode is %v, want 0600: it holds lease IDs and signing keys", fi.Mode().Perm())
	}
	for range 3 {
		highest = max(highest, grant(s))
	}

	r := startFenced(t, "--restore", file)
	var st getOutput
	r.wantJSON(t, 0, &st, "get", "kept")
	if !st.Held || st.Token != kept.Token {
		t.Errorf("kept after the restore: %+v; want held with token %d", st, kept.Token)
	}
	if tok := grant(r); tok <= highest {
		t.Errorf("the restored service granted token %d; the first granted up to %d", tok, highest)
	}
	r.want(t, exitUsage, "backup")
}
