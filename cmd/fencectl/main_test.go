//go:build unix

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
)

// The binaries under test, built once by TestMain.
var fencedBin, fencectlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencectl-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fencedBin = filepath.Join(dir, "fenced")
	fencectlBin = filepath.Join(dir, "fencectl")
	builds := [][]string{
		{"go", "build", "-o", fencedBin, "../fenced"},
		{"go", "build", "-o", fencectlBin, "."},
	}
	if race {
		builds[1] = slices.Insert(builds[1], 2, "-race")
	}
	for _, b := range builds {
		if out, err := exec.Command(b[0], b[1:]...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n%s", strings.Join(b, " "), err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fenced is a running fenced process.
type fenced struct {
	addr string
	log  string // the file fenced writes its log to
}

// maxTTL is the --max-ttl every test server runs with.
const maxTTL = time.Minute

// startFenced runs fenced on a free loopback port with its data in a
// temporary directory, waits until it answers, and kills it when the test
// ends. Its tokens are unsigned, so tests can spell them out; extra flags
// (such as --sign-tokens=true) come after and win, --listen ADDR included.
func startFenced(t *testing.T, extra ...string) *fenced {
	t.Helper()
	addr := freeAddr(t)
	for i := range len(extra) - 1 {
		if extra[i] == "--listen" {
			addr = extra[i+1]
		}
	}
	logPath := filepath.Join(t.TempDir(), "fenced.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(fencedBin, append([]string{"--data-dir", t.TempDir(), "--listen", addr, "--max-ttl", maxTTL.String(), "--sign-tokens=false"}, extra...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("fenced pid %d still running 10s after SIGKILL", cmd.Process.Pid)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("fenced log:\n%s", b)
		}
	})

	c, err := client.New(addr, client.WithRetryTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for deadline := time.Now().Add(20 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, "probe")
		cancel()
		if err == nil || errors.Is(err, fence.ErrUnauthenticated) { // answering, with --auth-file
			return &fenced{addr: addr, log: logPath}
		}
		select {
		case <-exited:
			t.Fatalf("fenced exited during start-up")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fenced not answering after 20s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// floor returns the token floor s took office with: the last token of a
// scope nothing ever used. Every start of fenced raises every scope's
// counter to at least its wall clock in microseconds, so while s stays
// leader a scope's first grant has token floor+1, its next floor+2, and
// so on.
func (s *fenced) floor(t *testing.T) uint64 {
	t.Helper()
	var st getOutput
	s.wantJSON(t, 0, &st, "get", "never-used")
	if st.Held {
		t.Fatalf("the never used scope is held: %+v", st)
	}
	return st.LastToken
}

// freeAddr returns a loopback address nothing listens on: free to listen
// on, and refusing connections until something does.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// result is how one fencectl run ended.
type result struct {
	args           []string
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("fencectl %q: exit status %d\nstdout: %s\nstderr: %s", r.args, r.code, r.stdout, r.stderr)
}

// command prepares fencectl with args against s (through FENCE_ADDR).
func (s *fenced) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, fencectlBin, args...)
	// A race-enabled fencectl would sleep 1s at exit by default; a race
	// it finds makes it exit with status 66, which no test expects.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), "FENCE_ADDR="+s.addr, "FENCECTL="+fencectlBin, "GORACE="+gorace)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// ctl runs fencectl with args to the end, at most a minute.
func (s *fenced) ctl(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := s.command(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("fencectl %q: %v", args, err)
	}
	return result{args: args, code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// want runs fencectl and fails the test unless it exits with code.
func (s *fenced) want(t *testing.T, code int, args ...string) result {
	t.Helper()
	r := s.ctl(t, args...)
	if r.code != code {
		t.Fatalf("want exit status %d, got %v", code, r)
	}
	return r
}

// wantJSON runs fencectl with -o json, wants exit status code and decodes
// its stdout, one JSON object on one line, into v: through the API's
// message with protojson (which refuses unknown fields) where v is one of
// the API's shapes, strictly with encoding/json otherwise.
func (s *fenced) wantJSON(t *testing.T, code int, v any, args ...string) result {
	t.Helper()
	r := s.want(t, code, append(args, "-o", "json")...)
	if strings.Count(r.stdout, "\n") != 1 || !strings.HasSuffix(r.stdout, "\n") {
		t.Fatalf("stdout is not one line\n%v", r)
	}
	if err := decodeJSON([]byte(r.stdout), v); err != nil {
		t.Fatalf("decode stdout: %v\n%v", err, r)
	}
	return r
}

// apiShape is a test's view of one of the API's messages, filled from the
// message protojson decodes.
type apiShape interface{ fromAPI(b []byte) error }

func decodeJSON(b []byte, v any) error {
	if a, ok := v.(apiShape); ok {
		return a.fromAPI(b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// The JSON shapes the tests read: the API's messages (acquire's and
// renew's {"lease": LEASE}, get's, list's, release's), flattened for the
// checks; unknown fields fail the decoding.
type leaseOutput struct {
	Scope       string
	Token       uint64
	TokenText   string
	LeaseID     string
	Holder      string
	TTLMs       int64
	ExpiresInMs int64
}

func leaseOf(p *fencev1.Lease) leaseOutput {
	return leaseOutput{Scope: p.GetScope(), Token: p.GetToken(), TokenText: p.GetTokenText(), LeaseID: p.GetLeaseId(),
		Holder: p.GetHolder(), TTLMs: p.GetTtl().AsDuration().Milliseconds(), ExpiresInMs: p.GetExpiresIn().AsDuration().Milliseconds()}
}

// fromAPI reads acquire's and renew's output: AcquireResponse, which is
// RenewResponse's shape too.
func (l *leaseOutput) fromAPI(b []byte) error {
	var m fencev1.AcquireResponse
	if err := protojson.Unmarshal(b, &m); err != nil {
		return err
	}
	if m.Lease == nil {
		return errors.New("no lease")
	}
	*l = leaseOf(m.Lease)
	return nil
}

type getOutput struct {
	Scope     string
	Held      bool // the lease is there
	LastToken uint64
	leaseOutput
	Waiters int
}

func (g *getOutput) fromAPI(b []byte) error {
	var m fencev1.GetResponse
	if err := protojson.Unmarshal(b, &m); err != nil {
		return err
	}
	*g = getOutput{Scope: m.Scope, Held: m.Lease != nil, LastToken: m.LastToken, Waiters: int(m.Waiters)}
	if m.Lease != nil {
		g.leaseOutput = leaseOf(m.Lease)
	}
	return nil
}

type releaseOutput struct {
	Scope string
	Token uint64
}

func (r *releaseOutput) fromAPI(b []byte) error {
	var m fencev1.ReleaseResponse
	if err := protojson.Unmarshal(b, &m); err != nil {
		return err
	}
	*r = releaseOutput{Scope: m.Scope, Token: m.Token}
	return nil
}

type listOutput struct {
	Leases []leaseOutput
}

func (o *listOutput) fromAPI(b []byte) error {
	var m fencev1.ListResponse
	if err := protojson.Unmarshal(b, &m); err != nil {
		return err
	}
	o.Leases = nil
	for _, l := range m.Leases {
		o.Leases = append(o.Leases, leaseOf(l))
	}
	return nil
}

// errorOutput has no API message: it follows the API's rules (names in
// lowerCamelCase, 64-bit integers and durations as strings).
type errorOutput struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	ExitStatus int    `json:"exitStatus"`
	Scope      string `json:"scope"`
	Holder     string `json:"holder"`
	Token      uint64 `json:"token,string"`
	ExpiresIn  string `json:"expiresIn"`
	Field      string `json:"field"`
}

// checkLease checks a lease the caller holds, as acquire and renew print it.
func checkLease(t *testing.T, l leaseOutput, scope, holder string, ttl time.Duration) {
	t.Helper()
	if l.Scope != scope || l.Holder != holder || l.TTLMs != ttl.Milliseconds() {
		t.Errorf("lease %+v: want scope %q, holder %q, ttl_ms %d", l, scope, holder, ttl.Milliseconds())
	}
	if l.Token == 0 {
		t.Errorf("lease %+v: token 0", l)
	}
	if want := (fence.Token{Scope: scope, Value: l.Token}).String(); l.TokenText != want {
		t.Errorf("token_text %q, want %q", l.TokenText, want)
	}
	if _, err := fence.ParseLeaseID(l.LeaseID); err != nil {
		t.Errorf("lease_id: %v", err)
	}
	if l.ExpiresInMs <= 0 || l.ExpiresInMs > l.TTLMs {
		t.Errorf("expires_in_ms %d, want in (0, %d]", l.ExpiresInMs, l.TTLMs)
	}
}

// positiveDuration reports whether s is a duration above 0 as protojson
// writes one ("4.998s").
func positiveDuration(s string) bool {
	d, err := time.ParseDuration(s)
	return err == nil && strings.HasSuffix(s, "s") && d > 0
}

// wantStderr fails unless stderr starts with "fencectl: " and has every
// one of subs.
func wantStderr(t *testing.T, r result, subs ...string) {
	t.Helper()
	if !strings.HasPrefix(r.stderr, "fencectl: ") {
		t.Errorf("stderr does not start with \"fencectl: \"\n%v", r)
	}
	for _, s := range subs {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("stderr lacks %q\n%v", s, r)
		}
	}
}

// TestWalkthrough is the new user's first session: acquire, renew, a wrong
// and a malformed release, release, acquire again, and someone else's
// acquire while the scope is held.
func TestWalkthrough(t *testing.T) {
	t.Parallel()
	s := startFenced(t)

	var first leaseOutput
	s.wantJSON(t, 0, &first, "acquire", "orders", "--holder", "a")
	checkLease(t, first, "orders", "a", 10*time.Second)
	t1 := first.Token

	var renewed leaseOutput
	s.wantJSON(t, 0, &renewed, "renew", "orders", "--lease", first.LeaseID)
	checkLease(t, renewed, "orders", "a", 10*time.Second)
	if renewed.Token != t1 || renewed.LeaseID != first.LeaseID {
		t.Errorf("renew changed the lease: %+v, was %+v", renewed, first)
	}

	// A well-formed lease ID that is not the lease's: refused, nothing changes.
	r := s.want(t, 1, "release", "orders", "--lease", fence.NewLeaseID().String())
	wantStderr(t, r, `"orders"`, "not the lease holder")
	var st getOutput
	s.wantJSON(t, 0, &st, "get", "orders")
	if !st.Held || st.Token != t1 || st.Holder != "a" || st.LastToken != t1 || st.LeaseID != "" {
		t.Errorf("after a wrong release, get says %+v; want held by \"a\" with token %d, no lease_id", st, t1)
	}

	r = s.want(t, 2, "release", "orders", "--lease", "not-an-id")
	wantStderr(t, r, "invalid lease_id", "32 hexadecimal digits")

	var rel releaseOutput
	s.wantJSON(t, 0, &rel, "release", "orders", "--lease", first.LeaseID)
	if want := (releaseOutput{Scope: "orders", Token: t1}); rel != want {
		t.Errorf("release: %+v, want %+v", rel, want)
	}

	// A free scope: exactly scope and lastToken, a 64-bit integer as a
	// string, as the API answers (protojson).
	r = s.want(t, 0, "get", "orders", "-o", "json")
	var free map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &free); err != nil {
		t.Fatal(err)
	}
	// Its last token is the closing of t1 (log format 8).
	if want := map[string]any{"scope": "orders", "lastToken": strconv.FormatUint(t1+1, 10)}; !mapsEqual(free, want) {
		t.Errorf("get of a free scope: %v, want %v", free, want)
	}
	r = s.want(t, 0, "get", "orders")
	if want := fmt.Sprintf("orders is free; last token %d\n", t1+1); r.stdout != want {
		t.Errorf("get text: %q, want %q", r.stdout, want)
	}

	// Acquire again, in text: a greater token.
	r = s.want(t, 0, "acquire", "orders", "--holder", "a", "--ttl", "30s")
	m := regexp.MustCompile(`^granted orders token (\d+) \(fence:v1:orders:(\d+)\) lease ([0-9a-f]{32}) holder "a"; ttl 30s\n$`).FindStringSubmatch(r.stdout)
	if m == nil || m[1] != m[2] {
		t.Fatalf("acquire text output does not match\n%v", r)
	}
	t2, _ := strconv.ParseUint(m[1], 10, 64)
	if t2 <= t1 {
		t.Fatalf("second grant has token %d, not greater than %d", t2, t1)
	}

	// Someone else: held, exit status 3, naming holder, token and time left.
	r = s.want(t, 3, "acquire", "orders", "--holder", "b")
	wantStderr(t, r, `held by "a"`, fmt.Sprintf("token %d", t2), "s left")
	if r.stdout != "" {
		t.Errorf("a failed text acquire wrote to stdout: %q", r.stdout)
	}
	var held errorOutput
	s.wantJSON(t, 3, &held, "acquire", "orders", "--holder", "b")
	if held.Code != "held" || held.ExitStatus != 3 || held.Scope != "orders" || held.Holder != "a" ||
		held.Token != t2 || !positiveDuration(held.ExpiresIn) || !strings.Contains(held.Error, `held by "a"`) {
		t.Errorf("held error object: %+v", held)
	}

	r = s.want(t, 0, "get", "orders")
	if !strings.HasPrefix(r.stdout, fmt.Sprintf(`orders is held by "a" with token %d (fence:v1:orders:%d); `, t2, t2)) {
		t.Errorf("get text of a held scope: %q", r.stdout)
	}
	var list listOutput
	s.wantJSON(t, 0, &list, "list")
	if len(list.Leases) != 1 || list.Leases[0].Scope != "orders" || list.Leases[0].Token != t2 || list.Leases[0].LeaseID != "" {
		t.Errorf("list: %+v", list)
	}
}

func mapsEqual(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestExpiryTakeover leaves a 1s lease unrenewed: a waiting acquire gets
// the scope after it expires, with a greater token, and the old lease can
// no longer be renewed.
func TestExpiryTakeover(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	var old leaseOutput
	s.wantJSON(t, 0, &old, "acquire", "jobs", "--holder", "a", "--ttl", "1s")

	// A lease that never expired would keep b waiting until --timeout,
	// which fails with status 3: a bound on a hang, generous for a busy
	// machine, not a measure of how soon the expiry came.
	var next leaseOutput
	s.wantJSON(t, 0, &next, "acquire", "jobs", "--holder", "b", "--wait", "--timeout", "20s")
	checkLease(t, next, "jobs", "b", 10*time.Second)
	if next.Token <= old.Token {
		t.Errorf("token after expiry %d, not greater than %d", next.Token, old.Token)
	}

	var lost errorOutput
	s.wantJSON(t, 1, &lost, "renew", "jobs", "--lease", old.LeaseID)
	if lost.Code != "lease_lost" && lost.Code != "not_holder" {
		t.Errorf("renew of an expired lease: %+v", lost)
	}
}

// TestWaitTimeout gives up waiting after --timeout with exit status 3 and
// names the holder.
func TestWaitTimeout(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	var l leaseOutput
	s.wantJSON(t, 0, &l, "acquire", "busy", "--holder", "a", "--ttl", "30s")
	// Status 3 and the message show that --timeout ended the wait: without
	// it, b would wait out a's 30s lease and get the scope (status 0).
	r := s.want(t, 3, "acquire", "busy", "--holder", "b", "--wait", "--timeout", "300ms")
	wantStderr(t, r, "gave up after --timeout 300ms", `held by "a"`, fmt.Sprintf("token %d", l.Token))
	var st getOutput
	s.wantJSON(t, 0, &st, "get", "busy")
	if st.Token != l.Token || st.Holder != "a" || st.Waiters != 0 {
		t.Errorf("after the timed-out wait: %+v; want a's lease and no waiters", st)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	for _, scope := range []string{"b/1", "a/2", "a/1"} {
		s.want(t, 0, "acquire", scope, "--holder", "h-"+scope)
	}
	var list listOutput
	s.wantJSON(t, 0, &list, "list", "a/")
	if len(list.Leases) != 2 || list.Leases[0].Scope != "a/1" || list.Leases[1].Scope != "a/2" ||
		list.Leases[0].Holder != "h-a/1" {
		t.Errorf("list a/: %+v", list)
	}
	r := s.want(t, 0, "list", "zz", "-o", "json")
	if r.stdout != "{}\n" { // the API's ListResponse leaves an empty list out
		t.Errorf("empty list: %q", r.stdout)
	}
	r = s.want(t, 0, "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "SCOPE") || !strings.HasPrefix(lines[1], "a/1 ") {
		t.Errorf("list text:\n%s", r.stdout)
	}
}

// TestExecEnvironment runs a command that sees its lease in the
// environment (scope and token, not the lease ID) and, while it runs, in
// the service; the lease is released when it exits.
func TestExecEnvironment(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	r := s.want(t, 0, "exec", "exports", "--holder", "e", "--", "sh", "-c",
		`echo "$FENCE_SCOPE|$FENCE_TOKEN|$FENCE_TOKEN_VALUE|$FENCE_LEASE_ID"; "$FENCECTL" get exports -o json`)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("want two lines of output\n%v", r)
	}
	f := strings.Split(lines[0], "|")
	if len(f) != 4 || f[0] != "exports" {
		t.Fatalf("environment line %q", lines[0])
	}
	tok, err := fence.ParseToken(f[1])
	if err != nil || tok.Scope != "exports" || strconv.FormatUint(tok.Value, 10) != f[2] {
		t.Errorf("FENCE_TOKEN %q, FENCE_TOKEN_VALUE %q: %v", f[1], f[2], err)
	}
	if f[3] != "" {
		t.Errorf("FENCE_LEASE_ID is %q; the command must not get the lease ID", f[3])
	}
	var during getOutput
	if err := decodeJSON([]byte(lines[1]), &during); err != nil {
		t.Fatal(err)
	}
	if !during.Held || during.Token != tok.Value || during.Holder != "e" {
		t.Errorf("while the command ran, get said %+v", during)
	}
	if r.stderr != "" {
		t.Errorf("stderr: %q", r.stderr)
	}

	var after getOutput
	s.wantJSON(t, 0, &after, "get", "exports")
	if after.Held || after.LastToken != tok.Value+1 {
		t.Errorf("after exec: %+v; want free with last token %d, the closing", after, tok.Value+1)
	}
}

// TestExecExitStatus passes the command's status on and releases the
// lease whatever it is; a held scope does not run the command.
func TestExecExitStatus(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	floor := s.floor(t)
	s.want(t, 7, "exec", "st", "--", "sh", "-c", "exit 7")
	s.want(t, 128+int(syscall.SIGTERM), "exec", "st", "--", "sh", "-c", "kill -TERM $$")
	r := s.want(t, 127, "exec", "st", "--", "/nonexistent/command")
	wantStderr(t, r, "/nonexistent/command")
	var st getOutput
	s.wantJSON(t, 0, &st, "get", "st")
	if st.Held || st.LastToken != floor+6 {
		t.Errorf("after three execs: %+v; want free with last token %d (the floor %d, plus 3 grants and their closings)", st, floor+6, floor)
	}

	s.want(t, 0, "acquire", "st", "--holder", "other")
	marker := filepath.Join(t.TempDir(), "ran")
	r = s.want(t, 3, "exec", "st", "--", "touch", marker)
	wantStderr(t, r, `held by "other"`)
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the command ran although the scope was held")
	}
}

// startExec starts fencectl exec in the background with a command that
// writes its PID to a file and then runs body in its place; it returns the
// command, a channel closed at its exit, and the child's PID once written.
func (s *fenced) startExec(t *testing.T, args []string, body string) (*exec.Cmd, *bytes.Buffer, <-chan struct{}, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	script := fmt.Sprintf(`echo "$$" > %s.tmp && mv %s.tmp %s; %s`, pidFile, pidFile, pidFile, body)
	cmd := s.command(ctx, append(append(args, "--"), "sh", "-c", script)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var pid int
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-done
		cancel()
		if pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			if _, err := fmt.Sscan(string(b), &pid); err != nil {
				t.Fatalf("pid file %q: %v", b, err)
			}
			return cmd, &stderr, done, pid
		}
		select {
		case <-done:
			t.Fatalf("fencectl exec exited before its command started: %v\n%s", cmd.ProcessState, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command did not start within 20s\n%s", stderr.String())
		}
	}
}

// waitExit waits at most d for done.
func waitExit(t *testing.T, done <-chan struct{}, d time.Duration) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("fencectl still running after %v", d)
	}
}

// gone reports whether no process has pid.
func gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

// groupGone waits up to 5s for process group pgid to have no live member
// (SIGKILL takes effect asynchronously) and reports whether it got there.
// Zombies count as gone: the children of a killed leader are reaped by
// init, whenever init gets to it.
func groupGone(pgid int) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if !groupAlive(pgid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func groupAlive(pgid int) bool {
	if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
		return false
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil || len(stats) == 0 {
		return true // no /proc: trust kill, zombies and all
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may contain spaces and ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 3 {
			continue
		}
		if fields[2] == strconv.Itoa(pgid) && fields[0] != "Z" {
			return true
		}
	}
	return false
}

// TestExecLeaseLost stops fencectl exec for twice its TTL: its renewals
// stop, and when it runs again its lease's local validity has run out. It
// must stop its command and exit with status 4.
func TestExecLeaseLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body, stopped string
	}{
		{"SIGTERM", "exec sleep 60", "with SIGTERM because"},
		// The command and its children ignore SIGTERM: SIGKILL after --grace.
		{"SIGKILL", "trap '' TERM; sleep 60; sleep 60", "then SIGKILL after --grace 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startFenced(t)
			floor := s.floor(t)
			cmd, stderr, done, pid := s.startExec(t,
				[]string{"exec", "lost", "--holder", "x", "--ttl", "1s", "--grace", "300ms"}, tc.body)

			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second)
			if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			waitExit(t, done, 10*time.Second)

			if code := cmd.ProcessState.ExitCode(); code != exitLeaseLost {
				t.Errorf("exit status %d, want %d (lease lost)\nstderr: %s", code, exitLeaseLost, stderr)
			}
			wantStderr(t, result{stderr: stderr.String()}, fmt.Sprintf(`lease on "lost" with token %d is lost`, floor+1), tc.stopped)
			if !gone(pid) {
				t.Errorf("the command, pid %d, is still running", pid)
			}
			if !groupGone(pid) {
				t.Errorf("process group %d still has live processes 5s after fencectl exited", pid)
			}

			var next leaseOutput
			s.wantJSON(t, 0, &next, "acquire", "lost", "--holder", "y", "--wait", "--timeout", "5s")
			if next.Token <= floor+1 {
				t.Errorf("the next grant has token %d, not greater than the lost lease's %d", next.Token, floor+1)
			}
		})
	}
}

// TestExecForwardsSignals passes SIGINT and SIGTERM to the command, exits
// with its status and releases the lease.
func TestExecForwardsSignals(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	floor := s.floor(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		scope := "fwd-" + strconv.Itoa(int(sig))
		cmd, stderr, done, pid := s.startExec(t, []string{"exec", scope}, "exec sleep 60")
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		waitExit(t, done, 10*time.Second)
		if code, want := cmd.ProcessState.ExitCode(), 128+int(sig); code != want {
			t.Errorf("%v: exit status %d, want %d\nstderr: %s", sig, code, want, stderr)
		}
		if !gone(pid) {
			t.Errorf("%v: the command, pid %d, is still running", sig, pid)
		}
		var st getOutput
		s.wantJSON(t, 0, &st, "get", scope)
		if st.Held || st.LastToken != floor+2 {
			t.Errorf("%v: after exec: %+v; want released, with last token %d (the floor %d, plus the grant and its closing)", sig, st, floor+2, floor)
		}
	}
}

// TestRefusalExitStatus: a call the service refuses for who is calling,
// or does not know, ends with an exit status and a JSON code of its own:
// 5 unauthenticated, 6 permission denied, 7 unimplemented.
func TestRefusalExitStatus(t *testing.T) {
	t.Parallel()
	const bearer = "s3cret-reader"
	sum := sha256.Sum256([]byte(bearer))
	authFile := filepath.Join(t.TempDir(), "auth.json")
	auth := fmt.Sprintf(`{"tokens": [{"identity": "reader", "sha256": %q}],
		"rules": [{"identity": "reader", "prefix": "", "allow": ["get"]}]}`, hex.EncodeToString(sum[:]))
	if err := os.WriteFile(authFile, []byte(auth), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startFenced(t, "--auth-file", authFile)
	s.want(t, 0, "get", "orders", "--auth-token", bearer)

	// A service that knows no call: an HTTP server that answers 404.
	none := httptest.NewServer(http.NotFoundHandler())
	defer none.Close()
	older := &fenced{addr: strings.TrimPrefix(none.URL, "http://")}

	for _, tc := range []struct {
		s      *fenced
		args   []string
		status int
		code   string
	}{
		{s, []string{"get", "orders"}, 5, "unauthenticated"},
		{s, []string{"get", "orders", "--auth-token", "wrong"}, 5, "unauthenticated"},
		{s, []string{"acquire", "orders", "--auth-token", bearer}, 6, "permission_denied"},
		{older, []string{"get", "orders"}, 7, "unimplemented"},
	} {
		var out errorOutput
		r := tc.s.wantJSON(t, tc.status, &out, tc.args...)
		if out.Code != tc.code || out.ExitStatus != tc.status {
			t.Errorf("code %q, exit_status %d; want %q, %d\n%v", out.Code, out.ExitStatus, tc.code, tc.status, r)
		}
	}
}

// TestBadInput checks that malformed input fails with the documented
// status before anything changes at the service.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := startFenced(t)
	floor := s.floor(t)
	zero := strings.Repeat("0", 32)
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"acquire", ""}, 2, "invalid scope: empty"},
		{[]string{"acquire", "a//b"}, 2, "empty segment"},
		{[]string{"acquire", "x y"}, 2, "invalid scope"},
		{[]string{"acquire"}, 2, "missing SCOPE"},
		{[]string{"acquire", "x", "y"}, 2, `unexpected argument "y"`},
		{[]string{"acquire", "x", "--ttl", "0"}, 2, "--ttl 0s: want a positive duration"},
		{[]string{"acquire", "x", "--ttl", "-1s"}, 2, "--ttl -1s"},
		{[]string{"acquire", "x", "--ttl=-1s"}, 2, "--ttl -1s"},
		{[]string{"acquire", "x", "--ttl", "ten"}, 2, `invalid argument "ten" for "--ttl"`},
		{[]string{"acquire", "x", "--ttl", "2m"}, 2, "--max-ttl"}, // the service refuses it
		{[]string{"acquire", "x", "--holder", "a\tb"}, 2, "invalid holder"},
		{[]string{"acquire", "x", "--timeout", "-1s"}, 2, "--timeout -1s"},
		{[]string{"acquire", "x", "--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"acquire", "x", "-o", "yaml"}, 2, `--output "yaml": want text or json`},
		{[]string{"acquire", "x", "--addr", "a:1,,b:2"}, 2, "--addr"},
		{[]string{"acquire", "x", "--addr", "a:1,a:1"}, 2, "listed twice"},
		{[]string{"renew", "x"}, 2, `required flag(s) "lease" not set`},
		{[]string{"renew", "x", "--lease", "abc"}, 2, "invalid lease_id"},
		{[]string{"release", "x", "--lease", zero}, 2, "zero ID"},
		{[]string{"release", "", "--lease", fence.NewLeaseID().String()}, 2, "invalid scope"},
		{[]string{"get", "../x"}, 2, `".." segment`},
		{[]string{"list", "bad prefix"}, 2, "invalid prefix"},
		{[]string{"list", "a", "b"}, 2, "at most one PREFIX"},
		{[]string{"exec", "x", "true"}, 2, "put -- before the command"},
		{[]string{"exec", "x", "--"}, 2, "missing COMMAND"},
		{[]string{"exec", "--", "true"}, 2, "missing SCOPE"},
		{[]string{"exec", "", "--", "true"}, 2, "invalid scope"},
		{[]string{"exec", "x", "--ttl", "0", "--", "true"}, 2, "--ttl"},
		{[]string{"exec", "x", "--grace", "-1s", "--", "true"}, 2, "--grace -1s"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
	} {
		r := s.ctl(t, tc.args...)
		if r.code != tc.code {
			t.Errorf("want exit status %d, got %v", tc.code, r)
			continue
		}
		wantStderr(t, r, tc.stderr)
		if r.code == 2 && !strings.Contains(r.stderr, "--help' for usage") && !strings.Contains(r.stderr, "--max-ttl") {
			t.Errorf("a usage error without a pointer to --help\n%v", r)
		}
		if r.stdout != "" {
			t.Errorf("text mode wrote to stdout on error\n%v", r)
		}
	}

	// With -o json, stdout holds one error object.
	var e errorOutput
	s.wantJSON(t, 2, &e, "acquire", "x", "--ttl", "0")
	if e.Code != "usage" || e.ExitStatus != 2 || !strings.Contains(e.Error, "--ttl") {
		t.Errorf("usage error object: %+v", e)
	}
	e = errorOutput{}
	s.wantJSON(t, 2, &e, "acquire", "x", "--ttl", "2m")
	if e.Code != "invalid" || e.Field != "ttl" || e.ExitStatus != 2 {
		t.Errorf("invalid ttl error object: %+v", e)
	}
	e = errorOutput{}
	s.wantJSON(t, 2, &e, "renew", "x", "--lease", "abc")
	if e.Code != "usage" || e.Field != "lease_id" {
		t.Errorf("malformed lease error object: %+v", e)
	}

	// None of it reached the state: x was never granted, so its last
	// token is the floor, like any scope never used.
	var st getOutput
	s.wantJSON(t, 0, &st, "get", "x", "--addr", s.addr)
	if st.Held || st.LastToken != floor {
		t.Errorf("bad input changed x: %+v; want free with last token %d, the floor", st, floor)
	}
}

// TestHelp checks that every command explains itself with examples.
func TestHelp(t *testing.T) {
	t.Parallel()
	s := &fenced{addr: "127.0.0.1:1"} // help never calls the service
	r := s.want(t, 0, "--help")
	for _, want := range []string{"Exit status:", "Examples:", "FENCE_ADDR", "comma-separated", "-o json", "acquire", "exec", "cluster", "held by another lease"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("fencectl --help lacks %q", want)
		}
	}
	for _, cmd := range []string{"acquire", "renew", "release", "get", "list", "exec", "watch", "cluster", "cluster status", "cluster add", "cluster remove"} {
		r := s.want(t, 0, append(strings.Fields(cmd), "--help")...)
		if !strings.Contains(r.stdout, "Examples:\n  fencectl "+cmd) || !strings.Contains(r.stdout, "--addr") {
			t.Errorf("fencectl %s --help lacks examples or --addr:\n%s", cmd, r.stdout)
		}
	}
	r = s.want(t, 0, "exec", "--help")
	for _, want := range []string{"FENCE_TOKEN_VALUE", "does not get the lease ID", "status 4", "--grace"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("fencectl exec --help lacks %q", want)
		}
	}
}
