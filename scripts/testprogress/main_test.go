package main

import (
	"strings"
	"testing"
)

// stream is go test -json output of three packages: one passes with a
// skipped test, one fails in a subtest, one has no tests.
const stream = `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestA"}
{"Action":"output","Package":"m/a","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"m/a","Test":"TestA","Output":"    a_test.go:1: chatty but passing\n"}
{"Action":"pass","Package":"m/a","Test":"TestA","Elapsed":0.1}
{"Action":"skip","Package":"m/a","Test":"TestDB","Elapsed":0}
{"Action":"pass","Package":"m/a","Elapsed":1.5}
{"Action":"start","Package":"m/b"}
{"Action":"output","Package":"m/b","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"m/b","Test":"TestOK","Output":"    b_test.go:3: not shown\n"}
{"Action":"pass","Package":"m/b","Test":"TestOK","Elapsed":0}
{"Action":"output","Package":"m/b","Test":"TestB","Output":"=== RUN   TestB\n"}
{"Action":"output","Package":"m/b","Test":"TestB/sub","Output":"=== RUN   TestB/sub\n"}
{"Action":"output","Package":"m/b","Test":"TestB/sub","Output":"    b_test.go:9: want 1, got 2\n"}
{"Action":"output","Package":"m/b","Test":"TestB/sub","Output":"    --- FAIL: TestB/sub (0.00s)\n"}
{"Action":"fail","Package":"m/b","Test":"TestB/sub","Elapsed":0}
{"Action":"output","Package":"m/b","Test":"TestB","Output":"--- FAIL: TestB (0.00s)\n"}
{"Action":"fail","Package":"m/b","Test":"TestB","Elapsed":0}
{"Action":"output","Package":"m/b","Output":"FAIL\n"}
{"Action":"fail","Package":"m/b","Elapsed":2.25}
{"Action":"skip","Package":"m/c","Output":"?   \tm/c\t[no test files]\n"}
`

func TestFailuresShowWhole(t *testing.T) {
	var out strings.Builder
	if newProgress(&out).read(strings.NewReader(stream)) {
		t.Error("read says everything passed")
	}
	got := out.String()
	for _, want := range []string{
		"ok   m/a", "(1 skipped)",
		"--- FAIL: TestB (0.00s)", "b_test.go:9: want 1, got 2", "--- FAIL: TestB/sub", "FAIL m/b",
		"-    m/c", "FAIL: 1 of 3 packages failed", "slowest: m/b 2s, m/a 2s",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"chatty but passing", "not shown", "=== RUN"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("output has %q:\n%s", unwanted, got)
		}
	}
}

func TestPassAndNothing(t *testing.T) {
	var out strings.Builder
	pass := `{"Action":"start","Package":"m/a"}` + "\n" + `{"Action":"pass","Package":"m/a","Elapsed":0.5}` + "\n"
	if !newProgress(&out).read(strings.NewReader(pass)) || !strings.Contains(out.String(), "PASS: 1 packages") {
		t.Errorf("a passing run:\n%s", out.String())
	}
	out.Reset()
	if newProgress(&out).read(strings.NewReader("")) {
		t.Errorf("an empty stream passed:\n%s", out.String())
	}
	out.Reset()
	build := `{"ImportPath":"m/d","Action":"build-output","Output":"d.go:1: syntax error\n"}` + "\n" +
		`{"ImportPath":"m/d","Action":"build-fail"}` + "\n" + pass
	if newProgress(&out).read(strings.NewReader(build)) || !strings.Contains(out.String(), "d.go:1: syntax error") {
		t.Errorf("a failed build passed, or its error is not shown:\n%s", out.String())
	}
}

// TestUnendedTestShown: a test binary killed inside a test (here SIGQUIT,
// as a hang is diagnosed) ends the package without a fail event for the
// test; its output, the goroutines' stacks, must still be shown.
func TestUnendedTestShown(t *testing.T) {
	const killed = `{"Action":"start","Package":"m/e"}
{"Action":"run","Package":"m/e","Test":"TestDone"}
{"Action":"output","Package":"m/e","Test":"TestDone","Output":"    e_test.go:1: finished, not shown\n"}
{"Action":"pass","Package":"m/e","Test":"TestDone","Elapsed":0}
{"Action":"run","Package":"m/e","Test":"Example"}
{"Action":"output","Package":"m/e","Test":"Example","Output":"=== RUN   Example\n"}
{"Action":"output","Package":"m/e","Test":"Example","Output":"SIGQUIT: quit\n"}
{"Action":"output","Package":"m/e","Test":"Example","Output":"goroutine 7 [sleep]:\n"}
{"Action":"output","Package":"m/e","Output":"FAIL\tm/e\t199.840s\n"}
{"Action":"fail","Package":"m/e","Elapsed":199.84}
`
	var out strings.Builder
	if newProgress(&out).read(strings.NewReader(killed)) {
		t.Error("read says everything passed")
	}
	got := out.String()
	for _, want := range []string{"SIGQUIT: quit", "goroutine 7 [sleep]:", "FAIL m/e"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "finished, not shown") || strings.Contains(got, "=== RUN") {
		t.Errorf("output has a passing test's lines or -v chatter:\n%s", got)
	}
}
