package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fence-dev/fence/internal/scrape"
)

// demoSection returns the part of the demo's output that tells the story
// whose header starts with title.
func demoSection(t *testing.T, stdout, title string) string {
	t.Helper()
	for _, sec := range strings.Split(stdout, "\n== ")[1:] {
		if strings.HasPrefix(sec, title) {
			return sec
		}
	}
	t.Fatalf("no story %q in the demo's output:\n%s", title, stdout)
	return ""
}

var (
	lateAccepted = regexp.MustCompile(`A   delayed write\((\d+)\) arrives, nobody else has written -> 200 ACCEPTED after A's lease expired: the guard has seen no token above (\d+)\n`)
	lateRefused  = regexp.MustCompile(`A   delayed write\((\d+)\) arrives, nobody else has written -> 409 REFUSED as stale: the register's mark is the closing token (\d+)\n`)
	closes       = regexp.MustCompile(`A's lease expires; the service closes token (\d+) with token (\d+), granted to nobody\n`)
)

// checkLate checks the demo's late story (invariant 9 at the demo's
// register): A's write, delayed past the end of its lease and arriving
// before anyone else wrote, is accepted without a follower (the window)
// and refused with one, by the closing token of A's lease.
func checkLate(t *testing.T, stdout string) {
	t.Helper()
	num := func(s string) uint64 { n, _ := strconv.ParseUint(s, 10, 64); return n }
	bare := demoSection(t, stdout, "late story, guard ON, no follower")
	if m := lateAccepted.FindStringSubmatch(bare); m == nil || m[1] != m[2] {
		t.Errorf("without a follower, the late write is not reported ACCEPTED with A's token as the guard's highest:\n%s", bare)
	}
	if !strings.Contains(bare, `final value: "late write by A"  <- THE WINDOW`) {
		t.Errorf("without a follower, the late write did not land:\n%s", bare)
	}
	followed := demoSection(t, stdout, "late story, guard ON, with a follower")
	m, c := lateRefused.FindStringSubmatch(followed), closes.FindStringSubmatch(followed)
	if m == nil || c == nil || c[1] != m[1] || num(c[2]) != num(m[1])+1 || c[2] != m[2] {
		t.Errorf("with a follower, the late write is not reported REFUSED by the closing token (token+1) of A's lease:\n%s", followed)
	}
	if !strings.Contains(followed, "F   advances the register's mark for demo/late-followed to the closing token") ||
		!strings.Contains(followed, `final value: "written by A while it held the lease"`) {
		t.Errorf("with a follower, the mark did not move or the late write landed:\n%s", followed)
	}
	if !strings.Contains(stdout, "Without a follower, the ended lease's late write was ACCEPTED") {
		t.Errorf("no closing line about the window\n%s", stdout)
	}
}

// TestDemo runs `fencectl demo` with each register store: with the guard
// on both stale writes are rejected and B's value stays; with it off both
// stories end in a lost update, which shows the guard is what makes the
// difference. In the late story, nobody writes after A: its delayed write
// is accepted without a follower, refused with one.
func TestDemo(t *testing.T) {
	for _, tc := range []struct {
		args          []string
		guarded, bare string // how the headers name the register
	}{
		{[]string{"demo"}, "SQLite via sqlguard", "SQLite, unguarded"}, // the default
		{[]string{"demo", "--store", "bolt"}, "bbolt via boltguard", "bbolt, unguarded"},
		// The bucket of FENCE_TEST_S3, reached through the AWS environment.
		{[]string{"demo", "--store", "s3"}, "S3 via s3guard", "S3, unguarded"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := tc.args
			var leftOver func() []string
			if args[len(args)-1] == "s3" {
				args, leftOver = demoBucket(t)
			}
			r := (&fenced{}).want(t, exitOK, args...)
			if leftOver != nil {
				if keys := leftOver(); len(keys) > 0 {
					t.Errorf("the demo left %d objects in the bucket, such as %s", len(keys), keys[0])
				}
			}
			if n := strings.Count(r.stdout, "rejected as stale"); n != 2 {
				t.Errorf("%d stale rejections, want 2 (the guarded stories)\n%s", n, r.stdout)
			}
			if n := strings.Count(r.stdout, "LOST UPDATE"); n != 2 {
				t.Errorf("%d lost updates, want 2 (the unguarded stories)\n%s", n, r.stdout)
			}
			for name, want := range map[string]int{tc.guarded: 4, tc.bare: 2} {
				if n := strings.Count(r.stdout, "register in "+name+")"); n != want {
					t.Errorf("%d stories name the register %q, want %d\n%s", n, name, want, r.stdout)
				}
			}
			checkLate(t, r.stdout)
			if !strings.Contains(r.stdout, "Leases from a fenced in this process") {
				t.Errorf("the demo does not say where its leases come from\n%s", r.stdout)
			}
			if !strings.Contains(r.stdout, "every stale write was rejected") {
				t.Errorf("no verdict line\n%s", r.stdout)
			}
		})
	}
}

// demoBucket returns the arguments of a demo on the test bucket, under a
// prefix of the test's own, and a func that lists the objects left there.
func demoBucket(t *testing.T) ([]string, func() []string) {
	api, bucket := testBucket(t)
	prefix := fmt.Sprintf("fencectl-demo/%08x/", rand.Uint32())
	return []string{"demo", "--store", "s3://" + bucket + "/" + prefix}, func() []string {
		var keys []string
		for p := s3.NewListObjectsV2Paginator(api, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix}); p.HasMorePages(); {
			page, err := p.NextPage(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range page.Contents {
				keys = append(keys, *o.Key)
			}
		}
		return keys
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
	checkLate(t, r.stdout)
	// The guard reported the three refusals (the late write's with a
	// follower included), as guardreport does: fenced counts them and its
	// status page names them.
	if !strings.Contains(r.stdout, `The guard reported its 3 refused writes to fenced as "fencectl demo"`) {
		t.Errorf("the demo does not say it reported its refusals\n%s", r.stdout)
	}
	if n, ok := scrape.Find(scrape.Families(t, f.addr), "fence_stale_rejections_reported_total"); n != 3 {
		t.Errorf("fence_stale_rejections_reported_total = %v (present %v), want 3", n, ok)
	}
	resp, err := http.Get("http://" + f.addr + "/status/leases")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, scope := range []string{"demo/pause-guarded", "demo/delay-guarded", "demo/late-followed"} {
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
	for _, scope := range []string{"demo/late-unfollowed", "demo/late-followed"} {
		var st getOutput
		f.wantJSON(t, exitOK, &st, "get", scope)
		if st.Held || st.LastToken != floor+2 {
			t.Errorf("%s on the fenced at --addr: %+v, want free, last token %d (the floor %d, then A's and its closing)", scope, st, floor+2, floor)
		}
	}
}
