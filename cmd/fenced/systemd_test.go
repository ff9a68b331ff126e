package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// unitPath is the systemd unit the repository ships.
const unitPath = "../../deploy/fenced.service"

// TestSystemdUnit checks deploy/fenced.service: it parses, keeps the
// settings its comments promise, and fenced takes the flags of its
// ExecStart. Where systemd-analyze is installed, it verifies the unit
// too, with ExecStart pointed at a fenced just built (verify wants the
// binary to exist), and fails on any complaint about the file.
func TestSystemdUnit(t *testing.T) {
	text, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	unit := parseUnit(t, text)
	for _, want := range []struct{ section, key, value string }{
		{"Service", "Restart", "on-failure"},
		{"Service", "DynamicUser", "yes"},
		{"Service", "StateDirectory", "fence"},
		{"Service", "KillSignal", "SIGTERM"},
		{"Service", "NoNewPrivileges", "yes"},
		{"Service", "ProtectSystem", "strict"},
		{"Install", "WantedBy", "multi-user.target"},
	} {
		if got := unit[want.section][want.key]; len(got) == 0 || got[len(got)-1] != want.value {
			t.Errorf("[%s] %s = %q, want %q", want.section, want.key, got, want.value)
		}
	}
	if len(unit["Service"]["LimitNOFILE"]) == 0 {
		t.Error("[Service] has no LimitNOFILE: --max-conns defaults to 3/4 of it")
	}
	execStart := unit["Service"]["ExecStart"]
	if len(execStart) != 1 {
		t.Fatalf("ExecStart = %q, want one command", execStart)
	}
	args := strings.Fields(execStart[0])
	if args[0] != "/usr/local/bin/fenced" {
		t.Errorf("ExecStart runs %s, want /usr/local/bin/fenced (the path the unit's comments install it at)", args[0])
	}
	for _, a := range args[1:] {
		if strings.ContainsAny(a, `$"'\%`) {
			t.Errorf("ExecStart argument %q: this test splits on spaces only", a)
		}
	}
	if _, err := parse(args[1:], io.Discard); err != nil {
		t.Errorf("fenced refuses the unit's ExecStart flags %q: %v", args[1:], err)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("no systemd-analyze: the unit was parsed here, not verified by systemd")
		return
	}
	bin, err := filepath.Abs(fencedBin)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(t.TempDir(), "fenced.service")
	local := strings.Replace(string(text), "ExecStart="+args[0], "ExecStart="+bin, 1)
	if err := os.WriteFile(copyPath, []byte(local), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", copyPath).CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("fenced.service")) {
		t.Errorf("systemd-analyze verify deploy/fenced.service: %v\n%s", err, out)
	}
}

// parseUnit reads a systemd unit file: section → key → its values in
// order. It fails the test on a line that is neither a comment, a section
// header nor KEY=VALUE, and on a continued line, which the unit does not
// need.
func parseUnit(t *testing.T, text []byte) map[string]map[string][]string {
	t.Helper()
	unit := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case strings.HasSuffix(line, `\`):
			t.Fatalf("%s:%d: a continued line", unitPath, n)
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			if unit[section] != nil {
				t.Fatalf("%s:%d: section [%s] again", unitPath, n, section)
			}
			unit[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.TrimSpace(k) == "" {
				t.Fatalf("%s:%d: not KEY=VALUE in a section: %q", unitPath, n, line)
			}
			k = strings.TrimSpace(k)
			unit[section][k] = append(unit[section][k], strings.TrimSpace(v))
		}
	}
	for _, s := range []string{"Unit", "Service", "Install"} {
		if unit[s] == nil {
			t.Errorf("%s has no [%s] section", unitPath, s)
		}
	}
	return unit
}
