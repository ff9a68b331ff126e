//go:build unix

package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/signing"
)

// TestReadmeTour runs the README's tour line by line, as a newcomer would
// type it, against a fenced with the default (signed) tokens. The lines
// stay as they are written; only the placeholders a person copies from
// earlier output (LEASE_A, LEASE_B) are filled in. Each line's comment is
// its claim: "exit N" is its exit status (else 0), "token F+N" is in its
// output (F, the token floor the service started with, written out),
// "(LEASE_X)" names the lease ID it prints.
func TestReadmeTour(t *testing.T) {
	t.Parallel()
	lines := tourLines(t)
	// fenced's defaults, as the tour's bin/fenced has them: signed tokens,
	// and TTLs up to 5 minutes (the tour takes 2).
	s := startFenced(t, "--sign-tokens=true", "--max-ttl=5m")
	floor := s.floor(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fencectlBin, filepath.Join(dir, "bin", "fencectl")); err != nil {
		t.Fatal(err)
	}

	var (
		exitRe        = regexp.MustCompile(`#.*\bexit (\d+)`)
		tokenRe       = regexp.MustCompile(`#.*\btoken F\+(\d+)`)
		definesRe     = regexp.MustCompile(`#.*\((LEASE_[A-Z])\)`)
		placeholderRe = regexp.MustCompile(`\bLEASE_[A-Z]\b`)
		leaseTextRe   = regexp.MustCompile(` lease ([0-9a-f]{32}) `)
		leaseJSONRe   = regexp.MustCompile(`"leaseId":"([0-9a-f]{32})"`)
	)
	ids := map[string]string{}
	var last result
	for i, line := range lines {
		want := 0
		if m := exitRe.FindStringSubmatch(line); m != nil {
			want, _ = strconv.Atoi(m[1])
		}
		code, _, _ := strings.Cut(line, "#")
		var missing string
		code = placeholderRe.ReplaceAllStringFunc(code, func(p string) string {
			if id, ok := ids[p]; ok {
				return id
			}
			missing = p
			return p
		})
		if missing != "" {
			t.Fatalf("line %d uses %s before a line names it:\n%s", i+1, missing, line)
		}
		last = s.shell(t, dir, code)
		if last.code != want {
			t.Fatalf("line %d: want exit status %d\n%s\n%v", i+1, want, line, last)
		}
		if m := tokenRe.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseUint(m[1], 10, 64)
			tok := strconv.FormatUint(floor+n, 10)
			said := regexp.MustCompile(`\btoken ` + tok + `\b|"token":"` + tok + `"`)
			if !said.MatchString(last.stdout + last.stderr) {
				t.Errorf("line %d promises token %s:\n%s\n%v", i+1, tok, line, last)
			}
		}
		if m := definesRe.FindStringSubmatch(line); m != nil {
			id := leaseTextRe.FindStringSubmatch(last.stdout)
			if id == nil {
				id = leaseJSONRe.FindStringSubmatch(last.stdout)
			}
			if id == nil {
				t.Fatalf("line %d promises a lease ID (%s), but printed none\n%v", i+1, m[1], last)
			}
			ids[m[1]] = id[1]
		}
		if want == exitHeld {
			wantStderr(t, last, "held by")
		}
	}
	// The last line is the exec: its command saw a signed token of the
	// third grant, each end before it having closed a token.
	third := fmt.Sprintf("I hold fence:v3:orders:%d:", floor+5)
	if !strings.Contains(lines[len(lines)-1], "exec") || !strings.HasPrefix(last.stdout, third) {
		t.Errorf("the tour's exec printed %q, want %s...", last.stdout, third)
	}
}

// tourLines returns the fencectl lines of the README's tour.
func tourLines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, tour, ok := strings.Cut(string(b), "## A one-minute tour\n")
	if !ok {
		t.Fatal("README.md has no section \"A one-minute tour\"")
	}
	tour, _, _ = strings.Cut(tour, "\n## ")
	for _, block := range strings.Split(tour, "```sh\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		lines := strings.Split(strings.TrimSpace(block), "\n")
		if strings.HasPrefix(lines[0], "bin/fencectl ") {
			return lines
		}
	}
	t.Fatal("README.md's tour has no block of bin/fencectl lines")
	return nil
}

// shell runs line with sh in dir, against s, as a person's shell would.
func (s *fenced) shell(t *testing.T, dir, line string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := s.command(ctx)
	cmd.Path, cmd.Args, cmd.Dir = "/bin/sh", []string{"sh", "-c", line}, dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("sh -c %q: %v", line, err)
	}
	return result{args: []string{line}, code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// TestExecHelpClaims checks what exec --help says about the token against
// what exec sets and what httpguard reads: the header its example sends,
// and the text forms of FENCE_TOKEN, signed (the default) and unsigned.
func TestExecHelpClaims(t *testing.T) {
	t.Parallel()
	help := (&fenced{addr: "127.0.0.1:1"}).want(t, 0, "exec", "--help").stdout
	headers := regexp.MustCompile(`-H "([A-Za-z-]+): \$FENCE_TOKEN"`).FindAllStringSubmatch(help, -1)
	if len(headers) == 0 {
		t.Errorf("exec --help shows no header carrying $FENCE_TOKEN:\n%s", help)
	}
	for _, h := range headers {
		if h[1] != httpguard.TokenHeader {
			t.Errorf("exec --help sends the token in %s; httpguard reads %s", h[1], httpguard.TokenHeader)
		}
	}
	if !strings.Contains(help, httpguard.TokenHeader) {
		t.Errorf("exec --help does not name the %s header", httpguard.TokenHeader)
	}

	for _, tc := range []struct {
		version, signFlag string
	}{
		{"v3", "--sign-tokens=true"},
		{"v1", "--sign-tokens=false"},
	} {
		t.Run(tc.version, func(t *testing.T) {
			t.Parallel()
			form := regexp.MustCompile(`fence:` + tc.version + `(:[A-Z_]+)+`).FindString(help)
			if form == "" {
				t.Fatalf("exec --help does not document the fence:%s form:\n%s", tc.version, help)
			}
			s := startFenced(t, tc.signFlag)
			r := s.want(t, 0, "exec", "help/"+tc.version, "--", "sh", "-c",
				`printf '%s\n' "$FENCE_TOKEN" "$FENCE_TOKEN_VALUE"`)
			env := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
			if len(env) != 2 {
				t.Fatalf("want two lines\n%v", r)
			}
			if re := formRegexp(form, "help/"+tc.version, env[1]); !re.MatchString(env[0]) {
				t.Errorf("FENCE_TOKEN %q does not have the documented form %s (%s)", env[0], form, re)
			}

			// httpguard takes FENCE_TOKEN whole from the header the help
			// names, and a verifier with fenced's keys takes a signed one.
			var opts []guard.Option
			if tc.version == "v3" {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				keys, err := signing.Fetch(ctx, nil, s.addr)
				if err != nil {
					t.Fatal(err)
				}
				opts = append(opts, guard.WithVerifier(keys))
			}
			g := guard.New(guard.NewMemoryStore(), opts...)
			fenced, err := httpguard.Middleware(g, "help/"+tc.version)
			if err != nil {
				t.Fatal(err)
			}
			h := fenced(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusNoContent)
			}))
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			req.Header.Set(httpguard.TokenHeader, env[0])
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusNoContent {
				t.Errorf("httpguard answered %d to %s: %s", rec.Code, env[0], rec.Body)
			}
			if _, err := fence.ParseToken(env[0]); err != nil {
				t.Error(err)
			}
		})
	}
}

// formRegexp turns a documented form such as
// fence:v3:SCOPE:N:KEY_ID:SIGNATURE into a pattern that the
// known fields must match exactly.
func formRegexp(form, scope, value string) *regexp.Regexp {
	known := map[string]string{"SCOPE": scope, "N": value, "TOKEN": value, "VALUE": value}
	parts := strings.Split(form, ":")
	for i, p := range parts {
		if v, ok := known[p]; ok {
			parts[i] = regexp.QuoteMeta(v)
		} else if i > 1 {
			parts[i] = `[^:]+`
		}
	}
	return regexp.MustCompile("^" + strings.Join(parts, ":") + "$")
}
