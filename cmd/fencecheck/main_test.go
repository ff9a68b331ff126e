package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"go.uber.org/goleak"

	"github.com/fence-dev/fence/internal/history"
)

// bin is the directory holding fencecheck and fenced, built once.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencecheck-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = dir
	out, err := exec.Command("go", "build", "-o", dir+"/", ".", "../fenced").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build fencecheck and fenced: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		// The proxies and test servers of the in-process tests must be gone.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// testPostgres returns the DSN of the shared test PostgreSQL
// (FENCE_TEST_POSTGRES, default the one of scripts/services.env). When it
// is unreachable the runs use bbolt alone, except in CI, where a missing
// PostgreSQL is a failure.
func testPostgres(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("FENCE_TEST_POSTGRES")
	if dsn == "" {
		dsn = "postgres://fence:fence@127.0.0.1:54329/fence?sslmode=disable"
	}
	db, err := sql.Open("pgx", dsn)
	if err == nil {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = db.PingContext(ctx)
	}
	if err != nil {
		msg := fmt.Sprintf("PostgreSQL at %s is unreachable: %v", dsn, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Log(msg + "; running on bbolt alone (run `make services`, or set FENCE_TEST_POSTGRES)")
		return ""
	}
	return dsn
}

// fencecheck runs `fencecheck run` with args and returns its exit status
// and output. Without --dir in args, the run's temporary directory is made
// in a directory of the test's, which it returns.
func fencecheck(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "fencecheck"), append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), tmp
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String(), tmp
	}
	t.Fatalf("fencecheck run: %v\n%s", err, out.String())
	return 0, "", ""
}

// runDir checks what became of a run's temporary directory in tmp: a run
// that passed removed it and said so; one that found anomalies kept it,
// with the history, and said where.
func runDir(t *testing.T, out, tmp string, passed bool) {
	t.Helper()
	ents, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if passed {
		if len(ents) != 0 || !strings.Contains(out, "removed "+tmp+"/fencecheck-") {
			t.Errorf("a run that passed left %d entries in %s, or did not say it removed its directory", len(ents), tmp)
		}
		return
	}
	if len(ents) != 1 {
		t.Fatalf("%d entries in %s, want the kept run's directory", len(ents), tmp)
	}
	dir := filepath.Join(tmp, ents[0].Name())
	if !strings.Contains(out, "kept "+dir+":") {
		t.Errorf("the output does not say it kept %s", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "history.jsonl")); err != nil {
		t.Errorf("the kept directory has no history: %v", err)
	}
}

var (
	scheduleLine = regexp.MustCompile(`(?m)^schedule: (.*)$`)
	countLine    = regexp.MustCompile(`^  (\S+) +(\d+)`)
)

// faultsAddUp checks that every fault the schedule planned is either
// among the faults injected or said not to be, with a reason.
func faultsAddUp(t *testing.T, out string) {
	t.Helper()
	m := scheduleLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no schedule line in the output")
	}
	planned := map[string]int{}
	for part := range strings.SplitSeq(m[1], ", ") {
		var k string
		var n int
		if _, err := fmt.Sscanf(part, "%s %d", &k, &n); err != nil {
			t.Fatalf("schedule %q: %v", m[1], err)
		}
		planned[k] = n
	}
	got := map[string]int{}
	section := ""
	for line := range strings.Lines(out) {
		switch {
		case strings.HasPrefix(line, "faults injected:"):
			section = "injected"
		case strings.HasPrefix(line, "planned but not injected:"):
			section = "missed"
		case !strings.HasPrefix(line, "  "):
			section = ""
		case section != "":
			if c := countLine.FindStringSubmatch(line); c != nil {
				n, _ := strconv.Atoi(c[2])
				got[c[1]] += n
			}
		}
	}
	delete(got, "error") // a failed restart, recorded beside the crash
	if !maps.Equal(planned, got) {
		t.Errorf("planned %v, but injected plus not injected %v", planned, got)
	}
}

var anomaliesLine = regexp.MustCompile(`(?m)^anomalies: (\d+)$`)

func anomalies(t *testing.T, out string) int {
	t.Helper()
	m := anomaliesLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no line 'anomalies: N' in the output:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// shortRun is the short form that `make test` runs: 20 seconds, one
// fenced, every fault, four workers contending for two scopes per store,
// one of them followed.
var shortRun = []string{"--time", "20s", "--seed", "20261203", "--workers", "4", "--scopes", "2", "--faults", "all"}

var eagerLine = regexp.MustCompile(`(?m)^  (without|with) a follower +\(([^)]*)\): (\d+) leases ended, (\d+) marks advanced by a follower`)

// eagerGroups checks the run's measure of the window: the scopes with a
// follower and those without each saw leases end, and only the followed
// ones' marks were advanced by the follower.
func eagerGroups(t *testing.T, out string) {
	t.Helper()
	ms := eagerLine.FindAllStringSubmatch(out, -1)
	if len(ms) != 2 {
		t.Fatalf("want the eager fencing lines of the scopes with and without a follower, got %q", ms)
	}
	for _, m := range ms {
		ends, _ := strconv.Atoi(m[3])
		marks, _ := strconv.Atoi(m[4])
		if ends == 0 {
			t.Errorf("%s a follower (%s): no lease end recorded", m[1], m[2])
		}
		if followed := m[1] == "with"; followed != (marks > 0) {
			t.Errorf("%s a follower (%s): %d marks advanced by a follower", m[1], m[2], marks)
		}
	}
}

// TestFencedRunPasses: with the guard on, the faults find nothing.
func TestFencedRunPasses(t *testing.T) {
	t.Parallel()
	fencedRunPasses(t, slices.Concat(shortRun, []string{"--postgres", testPostgres(t)}))
}

// fencedRunPasses runs fencecheck with args and checks that it found
// nothing, injected every fault it planned or said why not, measured the
// windows with and without a follower, and removed its files.
func fencedRunPasses(t *testing.T, args []string) {
	t.Helper()
	code, out, tmp := fencecheck(t, args...)
	t.Logf("fencecheck run %v:\n%s", args, out)
	if n := anomalies(t, out); code != exitOK || n != 0 {
		t.Errorf("exit status %d with %d anomalies, want 0 and 0", code, n)
	}
	faultsAddUp(t, out)
	eagerGroups(t, out)
	runDir(t, out, tmp, true)
}

// TestUnfencedRunFindsAnomalies: the same run with the guard off must find
// stale writes: a checker that cannot fail proves nothing.
func TestUnfencedRunFindsAnomalies(t *testing.T) {
	t.Parallel()
	unfencedRunFindsAnomalies(t, slices.Concat(shortRun, []string{"--postgres", testPostgres(t), "--no-fence"}))
}

// unfencedRunFindsAnomalies runs fencecheck with args and checks that it
// found anomalies, injected every fault it planned or said why not, and
// kept its files.
func unfencedRunFindsAnomalies(t *testing.T, args []string) {
	t.Helper()
	code, out, tmp := fencecheck(t, args...)
	t.Logf("fencecheck run %v:\n%s", args, out)
	if n := anomalies(t, out); code != exitAnomalies || n == 0 {
		t.Errorf("exit status %d with %d anomalies, want 1 and more than 0", code, n)
	}
	faultsAddUp(t, out)
	runDir(t, out, tmp, false)
}

// storageRun is the length of TestStorageFaultsRun: seed 197 plans each
// storage fault in it (TestStorageFaultsLeaveTheRestOfTheSchedule).
const storageRun = 24 * time.Second

// TestStorageFaultsRun: one fenced under the storage faults alone (a byte
// flipped and a segment cut short after kill -9, a cold copy put back, the
// disk filled), each injected, and no anomaly: whether fenced serves after
// the damage or refuses to start, naming its data directory, no token is
// granted twice or out of order and no stale write lands. fill needs root
// and a tmpfs; where the machine cannot mount one, the run must say so.
func TestStorageFaultsRun(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "run")
	args := []string{"--time", storageRun.String(), "--seed", "197", "--workers", "4", "--scopes", "1",
		"--faults", strings.Join(storageFaults, ","), "--dir", dir}
	code, out, _ := fencecheck(t, args...)
	t.Logf("fencecheck run %v:\n%s", args, out)
	if n := anomalies(t, out); code != exitOK || n != 0 {
		t.Errorf("exit status %d with %d anomalies, want 0 and 0", code, n)
	}
	faultsAddUp(t, out)
	evs, err := history.ReadFile(filepath.Join(dir, "nemesis.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	injected := map[string]int{}
	for _, e := range evs {
		switch {
		case e.Type == history.Fault && e.F == "error" && strings.Contains(e.Detail, "without naming its data directory"):
			// Safe (a node that does not start grants nothing), but
			// not the refusal naming the file that fenced promises.
			t.Logf("fenced stopped without naming its data directory: %s", e.Detail)
		case e.Type == history.Fault && e.F == "error":
			t.Errorf("error injecting a fault or starting fenced after it: %s", e.Detail)
		case e.Type == history.Fault:
			injected[e.F]++
		case e.Type == history.Note:
			t.Logf("%s: %s", e.F, e.Detail)
		}
	}
	for _, k := range storageFaults {
		switch {
		case injected[k] > 0:
		case k == faultFill && os.Geteuid() != 0 && strings.Contains(out, "which only root may mount"):
			t.Logf("fill not injected: not root")
		case k == faultFill && strings.Contains(out, "cannot mount a tmpfs here"):
			t.Logf("fill not injected: no tmpfs")
		default:
			t.Errorf("no %s injected", k)
		}
	}
	if !strings.Contains(out, "after the storage faults, fenced:") {
		t.Error("the output does not say how fenced came out of the storage faults")
	}
	if out, err := exec.Command("mount").Output(); err == nil && strings.Contains(string(out), dir) {
		t.Errorf("a tmpfs of the run is still mounted:\n%s", out)
	}
}

// testS3 returns the test S3 server and bucket (FENCE_TEST_S3, default
// the one of scripts/services.env), skipping the test when it does not
// answer, except in CI, where a missing server is a failure.
func testS3(t *testing.T) string {
	t.Helper()
	raw := os.Getenv("FENCE_TEST_S3")
	if raw == "" {
		raw = "http://fence:fence-secret@127.0.0.1:18339/fence-test"
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections() // for goleak
	api, bucket, err := s3Target(raw, &http.Client{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// One attempt: a missing server is not retried for seconds.
	_, err = api.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	if _, missing := errors.AsType[*types.NotFound](err); err != nil && !missing {
		msg := fmt.Sprintf("the S3 server of FENCE_TEST_S3 is unreachable: %v", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg + " (run `make services`, or set FENCE_TEST_S3)")
	}
	return raw
}

// TestS3FencedRunPasses: the workers on a bucket's scopes alone, each
// request applied through s3guard (every entry of the register's log one
// swap of the scope's mark), under every fault: nothing found.
func TestS3FencedRunPasses(t *testing.T) {
	t.Parallel()
	fencedRunPasses(t, slices.Concat(shortRun, []string{"--stores", "s3", "--s3", testS3(t)}))
}

// TestS3UnfencedRunFindsAnomalies: the same run on plain PUTs must find
// stale writes on the bucket's scopes.
func TestS3UnfencedRunFindsAnomalies(t *testing.T) {
	t.Parallel()
	unfencedRunFindsAnomalies(t, slices.Concat(shortRun, []string{"--stores", "s3", "--s3", testS3(t), "--no-fence"}))
}
