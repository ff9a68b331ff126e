package fence_test

import (
	"os"
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
