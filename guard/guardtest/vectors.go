package guardtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// CompareCase is one comparison case of the guard protocol's test vectors
// (testdata/protocol/vectors.json, docs/protocol.md): a token (and
// sequence) presented against the highest accepted, and whether a guard
// accepts it. Tokens are decimal strings, as they may exceed 2^53.
type CompareCase struct {
	Presented         string `json:"presented"`
	PresentedSequence uint64 `json:"presented_sequence"`
	Highest           string `json:"highest"`
	HighestSequence   uint64 `json:"highest_sequence"`
	Accepted          bool   `json:"accepted"`
	Why               string `json:"why"`
}

// CompareVectors returns the comparison cases of the protocol's test
// vectors, for guards written in another language (SQL, Lua) to be
// checked against the same cases as the Go code.
func CompareVectors(t testing.TB) []CompareCase {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "testdata", "protocol", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Compare []CompareCase `json:"compare"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("vectors.json: %v", err)
	}
	if len(v.Compare) == 0 {
		t.Fatal("vectors.json has no comparison cases")
	}
	return v.Compare
}
