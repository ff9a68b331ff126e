package fence_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks checks that every relative link in the README, BENCHMARKS.md
// and docs/ names a file that exists, and a heading of it when it names
// one, and that every results file BENCHMARKS.md quotes is in
// bench/results: the figures a reader is sent to must be there.
func TestDocLinks(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md", "BENCHMARKS.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		for _, target := range link.FindAllStringSubmatch(prose(t, page), -1) {
			ref := target[1]
			if strings.Contains(ref, "://") || strings.HasPrefix(ref, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(ref, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s, which does not exist", page, ref)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !headingSlugs(t, path)[anchor] {
				t.Errorf("%s links to %s: %s has no heading #%s", page, ref, path, anchor)
			}
		}
	}
	results := regexp.MustCompile(`(?:peers|scale)-\d{4}-?\d{2}-?\d{2}T\d{6}Z?\.(?:json|png)`)
	for _, name := range results.FindAllString(prose(t, "BENCHMARKS.md"), -1) {
		if _, err := os.Stat(filepath.Join("bench", "results", name)); err != nil {
			t.Errorf("BENCHMARKS.md quotes %s, which is not in bench/results", name)
		}
	}
}

// prose returns a Markdown file without its fenced code blocks.
func prose(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var out strings.Builder
	inCode := false
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			out.WriteString(line)
		}
	}
	return out.String()
}

// headingSlugs returns the anchors GitHub gives a Markdown file's headings:
// lower case, punctuation dropped, spaces as hyphens, a repeated one
// suffixed -1, -2 and so on.
func headingSlugs(tb testing.TB, path string) map[string]bool {
	tb.Helper()
	slugs := map[string]bool{}
	seen := map[string]int{}
	for line := range strings.Lines(prose(tb, path)) {
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			slugs[slug+"-"+strconv.Itoa(n)] = true
		} else {
			slugs[slug] = true
		}
		seen[slug]++
	}
	return slugs
}

// TestBenchmarkCitations checks that every code comment citing a section of
// BENCHMARKS.md by name, without a commit before it, names a heading the
// page still has: a section cut from the page is cited as it was in the
// commit that last had it (eda15be:BENCHMARKS.md and the name), so the reader
// sent to it finds it. A citation with a commit is checked against that
// commit's page when git can show it (a shallow clone may not have it).
func TestBenchmarkCitations(t *testing.T) {
	page, err := os.ReadFile("BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string][]string{"": headingTexts(string(page))}
	// A citation may break across comment lines: the section's name
	// follows the file's after whitespace and a comment marker.
	cite := regexp.MustCompile(`([0-9a-f]{7,40}:)?BENCHMARKS\.md,\s*(?:(?://|#|\*)\s*)?"([^"]+)"`)
	checked := 0
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".ts", ".py", ".md":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range cite.FindAllStringSubmatch(string(b), -1) {
			commit := strings.TrimSuffix(m[1], ":")
			headings, ok := pages[commit]
			if !ok {
				out, err := exec.Command("git", "show", commit+":BENCHMARKS.md").Output()
				if err != nil {
					t.Logf("%s cites %sBENCHMARKS.md, which git cannot show here: %v", path, m[1], err)
				}
				headings = headingTexts(string(out))
				pages[commit] = headings
			}
			if headings == nil {
				continue
			}
			checked++
			switch {
			case hasHeading(headings, m[2]):
			case commit == "":
				t.Errorf("%s cites BENCHMARKS.md, %q, which has no such heading: cite the commit that has it (eda15be:BENCHMARKS.md, %q) or move the reasoning next to the code", path, m[2], m[2])
			default:
				t.Errorf("%s cites %sBENCHMARKS.md, %q: the page at %s has no such heading", path, m[1], m[2], commit)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Errorf("found no citation of a BENCHMARKS.md section: the pattern %v no longer matches how comments cite it", cite)
	}
}

// headingTexts returns a Markdown page's headings without their #s.
func headingTexts(page string) []string {
	var headings []string
	inCode := false
	for line := range strings.Lines(page) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
		}
		if !inCode && strings.HasPrefix(line, "#") {
			headings = append(headings, strings.TrimSpace(strings.TrimLeft(line, "#")))
		}
	}
	return headings
}

// hasHeading reports whether name is one of headings, or one of them
// followed by the rest of its title (", 2026-12-04", " (ab5bf60)", "; three
// changes that...").
func hasHeading(headings []string, name string) bool {
	for _, h := range headings {
		rest, ok := strings.CutPrefix(h, name)
		if ok && (rest == "" || strings.ContainsAny(rest[:1], ",;") || strings.HasPrefix(rest, " (")) {
			return true
		}
	}
	return false
}
