package fence_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/fencetest"
)

// TestProtocolLeaseExamples runs every ```http exchange of
// docs/protocol.md, in order, against a real fenced that signs its tokens
// and starts them above its clock, as fenced does by default, and fails
// when an answer's status, headers or JSON differ from the document's: a
// field renamed, added or gone, a code or status changed, a message
// reworded. A request block is followed by its answer block. Values that
// change from run to run are placeholders (see placeholderKinds): each
// must have its kind's form, and one that names a value (a token, a lease
// ID) must be the same wherever it appears, requests included.
func TestProtocolLeaseExamples(t *testing.T) {
	doc := readProtocolDoc(t)
	exchanges := parseExchanges(t, doc)
	if len(exchanges) < 10 {
		t.Fatalf("docs/protocol.md has %d HTTP exchanges; the lease half should have them all", len(exchanges))
	}
	srv := fencetest.NewServer(fencetest.WithSigning(), fencetest.WithClockFloor())
	t.Cleanup(srv.Close)
	hc := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	vars := map[string]string{}
	for _, ex := range exchanges {
		if err := ex.run(hc, "http://"+srv.Addr, vars); err != nil {
			t.Fatalf("docs/protocol.md:%d: %s %s: %v", ex.line, ex.req.method, ex.req.target, err)
		}
	}
}

// TestProtocolLeaseCoverage keeps the lease half of docs/protocol.md
// complete: every method of LeaseService has an example, and every field
// of the messages they send and answer, and every event kind, is named.
func TestProtocolLeaseCoverage(t *testing.T) {
	doc := readProtocolDoc(t)
	exchanges := parseExchanges(t, doc)
	svc := fencev1.File_fence_v1_fence_proto.Services().ByName("LeaseService")
	if svc == nil {
		t.Fatal("no LeaseService in fence.proto")
	}
	seen := map[protoreflect.FullName]bool{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] || md.ParentFile().Package() == "google.protobuf" {
			return
		}
		seen[md.FullName()] = true
		for i := range md.Fields().Len() {
			fd := md.Fields().Get(i)
			name := fd.JSONName()
			if !strings.Contains(doc, "`"+name+"`") && !strings.Contains(doc, `"`+name+`"`) {
				t.Errorf("docs/protocol.md does not name %s's field %q (%s)", md.Name(), name, fd.Name())
			}
			if fd.Message() != nil {
				walk(fd.Message())
			}
			if e := fd.Enum(); e != nil {
				for j := 1; j < e.Values().Len(); j++ { // 0 is UNSPECIFIED
					if v := string(e.Values().Get(j).Name()); !strings.Contains(doc, v) {
						t.Errorf("docs/protocol.md does not name %s", v)
					}
				}
			}
		}
	}
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		path := "/fence.v1.LeaseService/" + string(m.Name())
		if !slices.ContainsFunc(exchanges, func(ex exchange) bool { return strings.HasPrefix(ex.req.target, path) }) {
			t.Errorf("docs/protocol.md has no example of %s", path)
		}
		walk(m.Input())
		walk(m.Output())
	}
	// The details an error carries are not in any method's messages.
	walk((&fencev1.LeaseConflict{}).ProtoReflect().Descriptor())
	walk((&fencev1.FieldViolation{}).ProtoReflect().Descriptor())
}

func readProtocolDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// placeholderKinds are the forms a placeholder <NAME> may take: NAME is a
// kind, or a kind and a number (<TOKEN_2>). A kind that binds names one
// value: its first appearance records it, and every later one, in an
// answer or a request, must be that value.
var placeholderKinds = map[string]struct {
	re   string
	bind bool
}{
	"TOKEN":       {`[1-9][0-9]{0,18}`, true},
	"LEASE_ID":    {`[0-9a-f]{32}`, true},
	"KEY_ID":      {`[a-z0-9-]{1,32}`, true},
	"POSITION":    {`[1-9][0-9]*`, true},
	"FINGERPRINT": {`[0-9a-f]{16}`, true},
	"PAGE_TOKEN":  {`[A-Za-z0-9_=+/-]+`, true},
	"SIGNATURE":   {`[A-Za-z0-9_-]{86}`, false},                                                       // 64 bytes, unpadded base64url
	"DURATION":    {`[0-9]+(?:\.[0-9]{1,9})?s`, false},                                                // protobuf JSON
	"TIME":        {`[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z`, false}, // RFC 3339, UTC
	"TIME_LEFT":   {`(?:[0-9]+h)?(?:[0-9]+m)?[0-9]+(?:\.[0-9]+)?(?:ns|µs|ms|s)`, false},               // Go's time.Duration text
	"BASE64":      {`[A-Za-z0-9+/]+`, false},                                                          // unpadded
	"TEXT":        {`.+`, false},
}

var placeholderRE = regexp.MustCompile(`<([A-Z][A-Z0-9_]*)>`)

// placeholderKind returns the kind of a placeholder's name.
func placeholderKind(name string) (string, error) {
	if _, ok := placeholderKinds[name]; ok {
		return name, nil
	}
	if i := strings.LastIndexByte(name, '_'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			if _, ok := placeholderKinds[name[:i]]; ok {
				return name[:i], nil
			}
		}
	}
	return "", fmt.Errorf("unknown placeholder <%s>", name)
}

// substitute replaces every placeholder of s with its bound value.
func substitute(s string, vars map[string]string) (string, error) {
	var err error
	out := placeholderRE.ReplaceAllStringFunc(s, func(m string) string {
		name := m[1 : len(m)-1]
		v, ok := vars[name]
		if !ok && err == nil {
			err = fmt.Errorf("%s is used before an answer gives it a value", m)
		}
		return v
	})
	return out, err
}

// matchString matches an answer's string against the document's, whose
// placeholders stand for values of their kinds, and binds them.
func matchString(want, got string, vars map[string]string) error {
	locs := placeholderRE.FindAllStringSubmatchIndex(want, -1)
	if locs == nil {
		if want != got {
			return fmt.Errorf("%q, want %q", got, want)
		}
		return nil
	}
	var re strings.Builder
	var names []string
	re.WriteString("^")
	prev := 0
	for _, l := range locs {
		re.WriteString(regexp.QuoteMeta(want[prev:l[0]]))
		name := want[l[2]:l[3]]
		kind, err := placeholderKind(name)
		if err != nil {
			return err
		}
		re.WriteString("(" + placeholderKinds[kind].re + ")")
		names = append(names, name)
		prev = l[1]
	}
	re.WriteString(regexp.QuoteMeta(want[prev:]) + "$")
	m := regexp.MustCompile(re.String()).FindStringSubmatch(got)
	if m == nil {
		return fmt.Errorf("%q does not have the form %q", got, want)
	}
	for i, name := range names {
		kind, _ := placeholderKind(name)
		if !placeholderKinds[kind].bind {
			continue
		}
		if v, ok := vars[name]; ok && v != m[i+1] {
			return fmt.Errorf("%q: <%s> is %s here and %s before", got, name, m[i+1], v)
		}
		vars[name] = m[i+1]
	}
	return nil
}

// matchJSON matches an answer's JSON value against the document's: the
// same keys, the same types, strings by matchString, numbers as written.
func matchJSON(path string, want, got any, vars map[string]string) error {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v, want an object", path, got)
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				return fmt.Errorf("%s: the answer has %q, which the document does not show", path, k)
			}
		}
		for _, k := range sortedKeys(w) {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s: the answer has no %q", path, k)
			}
			if err := matchJSON(path+"."+k, w[k], gv, vars); err != nil {
				return err
			}
		}
		if err := checkDetail(path, g); err != nil {
			return err
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: %v, want a list of %d", path, got, len(w))
		}
		for i := range w {
			if err := matchJSON(fmt.Sprintf("%s[%d]", path, i), w[i], g[i], vars); err != nil {
				return err
			}
		}
	case string:
		g, ok := got.(string)
		if !ok {
			return fmt.Errorf("%s: %v (%T), want a string", path, got, got)
		}
		if err := matchString(w, g, vars); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
	default: // json.Number, bool, nil
		if fmt.Sprint(want) != fmt.Sprint(got) || fmt.Sprintf("%T", want) != fmt.Sprintf("%T", got) {
			return fmt.Errorf("%s: %v, want %v", path, got, want)
		}
	}
	return nil
}

// checkDetail checks what the document says of an error detail: debug is
// value, the protobuf message in unpadded base64, in JSON.
func checkDetail(path string, d map[string]any) error {
	typ, ok1 := d["type"].(string)
	val, ok2 := d["value"].(string)
	debug, ok3 := d["debug"]
	if !ok1 || !ok2 || !ok3 {
		return nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typ))
	if err != nil {
		return fmt.Errorf("%s: detail type %q: %v", path, typ, err)
	}
	raw, err := base64.RawStdEncoding.DecodeString(val)
	if err != nil {
		return fmt.Errorf("%s: detail value: %v", path, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(raw, m); err != nil {
		return fmt.Errorf("%s: detail value: %v", path, err)
	}
	debugJSON, _ := json.Marshal(debug)
	d2 := mt.New().Interface()
	if err := protojson.Unmarshal(debugJSON, d2); err != nil {
		return fmt.Errorf("%s: detail debug: %v", path, err)
	}
	if !proto.Equal(m, d2) {
		return fmt.Errorf("%s: detail debug %s is not its value %v", path, debugJSON, m)
	}
	return nil
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func decodeJSON(s string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

// An exchange is a request block of the document and the answer block
// after it.
type exchange struct {
	line int // of the request block
	req  struct {
		method, target string
		header         http.Header
		body           string
		frames         []frame
	}
	resp struct {
		status int
		header http.Header
		body   string
		frames []frame
	}
}

// A frame is one message of Connect's streaming framing: a flags byte,
// the length (literal hexadecimal or <LENGTH>) and the JSON.
type frame struct {
	flags  byte
	length string
	json   string
}

var frameRE = regexp.MustCompile(`^([0-9a-f]{2}) ([0-9a-f]{8}|<LENGTH>) (.*)$`)

// parseFrames reads a body written as frames, one a line, continued on
// the lines that do not start a frame.
func parseFrames(body string) ([]frame, error) {
	var fs []frame
	for l := range strings.SplitSeq(body, "\n") {
		m := frameRE.FindStringSubmatch(l)
		if m == nil {
			if len(fs) == 0 {
				return nil, fmt.Errorf("%q does not start a frame (FLAGS LENGTH JSON)", l)
			}
			fs[len(fs)-1].json += "\n" + l
			continue
		}
		f, _ := strconv.ParseUint(m[1], 16, 8)
		fs = append(fs, frame{flags: byte(f), length: m[2], json: m[3]})
	}
	return fs, nil
}

// parseExchanges finds the document's ```http blocks and pairs each
// request with the answer that follows it.
func parseExchanges(t *testing.T, doc string) []exchange {
	t.Helper()
	var out []exchange
	var pending *exchange
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```http" {
			continue
		}
		start := i + 1
		j := start
		for j < len(lines) && lines[j] != "```" {
			j++
		}
		block := lines[start:j]
		i = j
		head, body, _ := strings.Cut(strings.Join(block, "\n"), "\n\n")
		hl := strings.Split(head, "\n")
		header := http.Header{}
		for _, h := range hl[1:] {
			k, v, ok := strings.Cut(h, ": ")
			if !ok {
				t.Fatalf("docs/protocol.md:%d: header line %q", start+1, h)
			}
			header.Add(k, v)
		}
		streaming := header.Get("Content-Type") == "application/connect+json"
		if status, ok := strings.CutPrefix(hl[0], "HTTP/1.1 "); ok {
			if pending == nil {
				t.Fatalf("docs/protocol.md:%d: an answer without a request before it", start)
			}
			code, reason, _ := strings.Cut(status, " ")
			n, err := strconv.Atoi(code)
			if err != nil || http.StatusText(n) != reason {
				t.Fatalf("docs/protocol.md:%d: status line %q (want e.g. HTTP/1.1 %d %s)", start+1, hl[0], n, http.StatusText(n))
			}
			pending.resp.status, pending.resp.header, pending.resp.body = n, header, body
			if streaming {
				fs, err := parseFrames(body)
				if err != nil {
					t.Fatalf("docs/protocol.md:%d: %v", start, err)
				}
				pending.resp.frames = fs
			}
			out = append(out, *pending)
			pending = nil
			continue
		}
		if pending != nil {
			t.Fatalf("docs/protocol.md:%d: a request whose answer is not shown", pending.line)
		}
		f := strings.Fields(hl[0])
		if len(f) != 3 || f[2] != "HTTP/1.1" {
			t.Fatalf("docs/protocol.md:%d: request line %q", start+1, hl[0])
		}
		ex := &exchange{line: start}
		ex.req.method, ex.req.target, ex.req.header, ex.req.body = f[0], f[1], header, body
		if streaming {
			fs, err := parseFrames(body)
			if err != nil {
				t.Fatalf("docs/protocol.md:%d: %v", start, err)
			}
			for _, fr := range fs {
				if fr.length != "<LENGTH>" && !placeholderRE.MatchString(fr.json) {
					if n, _ := strconv.ParseUint(fr.length, 16, 32); int(n) != len(fr.json) {
						t.Fatalf("docs/protocol.md:%d: frame length %s, but its JSON is %d (%08x) bytes", start, fr.length, len(fr.json), len(fr.json))
					}
				}
			}
			ex.req.frames = fs
		}
		pending = ex
	}
	if pending != nil {
		t.Fatalf("docs/protocol.md:%d: a request whose answer is not shown", pending.line)
	}
	return out
}

// run sends the exchange's request to base and checks the answer.
func (ex *exchange) run(hc *http.Client, base string, vars map[string]string) error {
	target, err := substitute(ex.req.target, vars)
	if err != nil {
		return err
	}
	var body []byte
	if ex.req.frames != nil {
		for _, f := range ex.req.frames {
			js, err := substitute(f.json, vars)
			if err != nil {
				return err
			}
			body = append(body, f.flags)
			body = binary.BigEndian.AppendUint32(body, uint32(len(js)))
			body = append(body, js...)
		}
	} else {
		s, err := substitute(ex.req.body, vars)
		if err != nil {
			return err
		}
		body = []byte(s)
	}
	req, err := http.NewRequest(ex.req.method, base+target, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, vs := range ex.req.header {
		for _, v := range vs {
			v, err := substitute(v, vars)
			if err != nil {
				return err
			}
			req.Header.Add(k, v)
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != ex.resp.status {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d, want %d: %s", resp.StatusCode, ex.resp.status, b)
	}
	for k := range ex.resp.header {
		if got, want := resp.Header.Get(k), ex.resp.header.Get(k); got != want {
			return fmt.Errorf("header %s: %q, want %q", k, got, want)
		}
	}
	if ex.resp.frames == nil {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		return matchBody(ex.resp.body, string(b), vars)
	}
	r := bufio.NewReader(resp.Body)
	for i, f := range ex.resp.frames {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return fmt.Errorf("frame %d: %v", i, err)
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		data := make([]byte, n)
		if _, err := io.ReadFull(r, data); err != nil {
			return fmt.Errorf("frame %d: %v", i, err)
		}
		if hdr[0] != f.flags {
			return fmt.Errorf("frame %d: flags %02x, want %02x: %s", i, hdr[0], f.flags, data)
		}
		if f.length != "<LENGTH>" && fmt.Sprintf("%08x", n) != f.length {
			return fmt.Errorf("frame %d: length %08x, want %s", i, n, f.length)
		}
		if err := matchBody(f.json, string(data), vars); err != nil {
			return fmt.Errorf("frame %d: %v", i, err)
		}
	}
	if last := ex.resp.frames[len(ex.resp.frames)-1]; last.flags&2 != 0 {
		if b, err := r.ReadByte(); err != io.EOF {
			return fmt.Errorf("the stream goes on after its end frame (%q, %v)", b, err)
		}
	}
	return nil
}

func matchBody(want, got string, vars map[string]string) error {
	w, err := decodeJSON(want)
	if err != nil {
		return fmt.Errorf("the document's JSON: %v", err)
	}
	g, err := decodeJSON(got)
	if err != nil {
		return fmt.Errorf("the answer %q: %v", got, err)
	}
	if err := matchJSON("$", w, g, vars); err != nil {
		return fmt.Errorf("%v\nthe answer: %s", err, got)
	}
	return nil
}
