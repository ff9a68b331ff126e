package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fence-dev/fence/internal/scrape"
)

// TestDemo runs `fencectl demo` with each register store: with the guard
// on both stale writes are rejected and B's value stays; with it off both
// stories end in a lost update, which shows the guard is what makes the
// difference.
func TestDemo(t *testing.T) {
	for _, tc := range []struct {
		args          []string
		guarded, bare string // how the headers name the register
	}{
		{[]string{"demo"}, "SQLite via sqlguard", "SQLite, unguarded"}, // the default
		{[]string{"demo", "--store", "bolt"}, "bbolt via boltguard", "bbolt, unguarded"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := (&fenced{}).want(t, exitOK, tc.args...)
			if n := strings.Count(r.stdout, "rejected as stale"); n != 2 {
				t.Errorf("%d stale rejections, want 2 (the guarded stories)\n%s", n, r.stdout)
			}
			if n := strings.Count(r.stdout, "LOST UPDATE"); n != 2 {
				t.Errorf("%d lost updates, want 2 (the unguarded stories)\n%s", n, r.stdout)
			}
			for _, name := range []string{tc.guarded, tc.bare} {
				if n := strings.Count(r.stdout, "register in "+name+")"); n != 2 {
					t.Errorf("%d stories name the register %q, want 2\n%s", n, name, r.stdout)
				}
			}
			if !strings.Contains(r.stdout, "Leases from a fenced in this process") {
				t.Errorf("the demo does not say where its leases come from\n%s", r.stdout)
			}
			if !strings.Contains(r.stdout, "every stale write was rejected") {
				t.Errorf("no verdict line\n%s", r.stdout)
			}
		})
	}
}

func TestDemoUnknownStore(t *testing.T) {
	r := (&fenced{}).want(t, exitUsage, "demo", "--store", "redis")
	if !strings.Contains(r.stderr, "want sqlite or bolt") {
		t.Errorf("stderr does not say which stores exist: %s", r.stderr)
	}
}

// TestDemoAddr plays the demo against the fenced that --addr names: the
// service then knows the demo's scopes, each at the token B acquired.
func TestDemoAddr(t *testing.T) {
	f := startFenced(t)
	floor := f.floor(t)
	r := (&fenced{}).want(t, exitOK, "demo", "--store", "bolt", "--addr", f.addr)
	if !strings.Contains(r.stdout, "Leases from the fenced at "+f.addr) {
		t.Errorf("the demo does not name the fenced it played against\n%s", r.stdout)
	}
	if n := strings.Count(r.stdout, "rejected as stale"); n != 2 {
		t.Errorf("%d stale rejections, want 2\n%s", n, r.stdout)
	}
	// The guard reported both refusals, as guardreport does: fenced counts
	// them and its status page names them.
	if !strings.Contains(r.stdout, `The guard reported its 2 refused writes to fenced as "fencectl demo"`) {
		t.Errorf("the demo does not say it reported its refusals\n%s", r.stdout)
	}
	if n, ok := scrape.Find(scrape.Families(t, f.addr), "fence_stale_rejections_reported_total"); n != 2 {
		t.Errorf("fence_stale_rejections_reported_total = %v (present %v), want 2", n, ok)
	}
	resp, err := http.Get("http://" + f.addr + "/status/leases")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, scope := range []string{"demo/pause-guarded", "demo/delay-guarded"} {
		if want := "fencectl demo refused " + scope + " token "; !strings.Contains(string(page), want) {
			t.Errorf("the status page lacks %q:\n%s", want, page)
		}
	}
	for _, scope := range []string{"demo/pause-guarded", "demo/delay-guarded", "demo/pause-unguarded", "demo/delay-unguarded"} {
		var st getOutput
		f.wantJSON(t, exitOK, &st, "get", scope)
		if st.LastToken != floor+4 {
			t.Errorf("%s on the fenced at --addr: %+v, want last token %d (the floor %d, then A's, its closing, B's and its closing)", scope, st, floor+4, floor)
		}
	}
}
