package fence_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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

// TestHolderRulesAgree checks that the holder's rules read the same in
// each place they are written: the numbered list under "The holder's
// rules" in docs/protocol.md, the Go client's package doc and the
// TypeScript and Python clients' READMEs has the same rules in the same
// order, each starting with the title protocol.md gives it in bold (code
// spans and doc links may name the language's own field), and each giving
// the same figures (fractions of the TTL, milliseconds) as protocol.md's.
func TestHolderRulesAgree(t *testing.T) {
	want := holderRules(t, "docs/protocol.md")
	if len(want) < 8 {
		t.Fatalf("docs/protocol.md lists %d holder's rules, want 8 or more: has the list moved?", len(want))
	}
	for _, path := range []string{"client/doc.go", "clients/typescript/README.md", "clients/python/README.md"} {
		got := holderRules(t, path)
		if len(got) != len(want) {
			t.Errorf("%s lists %d holder's rules, docs/protocol.md %d", path, len(got), len(want))
			continue
		}
		for i, w := range want {
			g := got[i]
			if !strings.HasPrefix(g.text, w.title) {
				t.Errorf("%s, holder's rule %d starts %q, want the title docs/protocol.md gives it: %q", path, i+1, g.text[:min(len(g.text), len(w.title)+20)], w.title)
			}
			if !slices.Equal(g.figures, w.figures) {
				t.Errorf("%s, holder's rule %d gives the figures %q, docs/protocol.md %q", path, i+1, g.figures, w.figures)
			}
		}
	}
}

// holderRule is one item of a holder's rules list, normalized: lower case,
// one space between words, code spans and doc links as "`x`", and no bold.
type holderRule struct {
	text    string
	title   string   // the bold text at its start, if any
	figures []string // fractions of the TTL and milliseconds, sorted
}

// holderRules returns the numbered list that follows the heading "The
// holder's rules" in a Markdown page or a Go package doc.
func holderRules(tb testing.TB, path string) []holderRule {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	item := regexp.MustCompile(`^\d+\.\s+`)
	var items []string
	in := false
	for line := range strings.Lines(string(b)) {
		if strings.HasSuffix(path, ".go") {
			rest, ok := strings.CutPrefix(line, "//")
			if !ok {
				continue
			}
			line = strings.TrimPrefix(rest, " ")
		}
		line = strings.TrimRight(line, "\n")
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "#"):
			if in {
				return normalizeRules(items)
			}
			in = strings.HasSuffix(trimmed, "The holder's rules")
		case !in || trimmed == "":
		case item.MatchString(trimmed):
			items = append(items, item.ReplaceAllString(trimmed, ""))
		case len(items) > 0 && line != trimmed:
			items[len(items)-1] += " " + trimmed
		case len(items) > 0:
			return normalizeRules(items) // a paragraph after the list ends it
		}
	}
	tb.Fatalf("%s has no heading \"The holder's rules\" followed by a numbered list", path)
	return nil
}

func normalizeRules(items []string) []holderRule {
	code := regexp.MustCompile("`[^`]*`|\\[[A-Za-z.]+\\]")
	bold := regexp.MustCompile(`^\*\*(.+?)\*\*`)
	figure := regexp.MustCompile(`\b(?:third|twentieth|tenth|half|quarter)\b|\b\d+ ?ms\b`)
	rules := make([]holderRule, len(items))
	for i, it := range items {
		it = strings.ToLower(code.ReplaceAllString(strings.Join(strings.Fields(it), " "), "`x`"))
		var r holderRule
		if m := bold.FindStringSubmatch(it); m != nil {
			r.title = strings.TrimRight(m[1], ".:,")
		}
		r.text = strings.ReplaceAll(it, "**", "")
		for _, f := range figure.FindAllString(r.text, -1) {
			r.figures = append(r.figures, strings.ReplaceAll(f, " ", ""))
		}
		slices.Sort(r.figures)
		r.figures = slices.Compact(r.figures)
		rules[i] = r
	}
	return rules
}
