// Package scrape reads one sample from a running fenced's /metrics, for
// tests that watch the service from outside, as an operator would.
package scrape

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Value returns the sample named name, with its labels as /metrics prints
// them (`fence_connections_refused_total{limit="max-conns"}`), from the
// fenced at addr (host:port, plain HTTP). It tries to connect again for up
// to 5 s: a test that has just closed its connections may find the
// server still counting them against its limits.
func Value(t testing.TB, addr, name string) float64 {
	t.Helper()
	var (
		resp *http.Response
		err  error
	)
	for range 50 {
		if resp, err = http.Get("http://" + addr + "/metrics"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s (%v)", name, sc.Err())
	return 0
}
