package s3guard

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/fence-dev/fence/guard"
)

// DefaultPrefix is where a Guard or Store keeps its objects in the bucket
// unless WithPrefix says otherwise: the marks under "fence/marks/", the
// data under "fence/data/".
const DefaultPrefix = "fence/"

const (
	// maxMarkBytes bounds the mark object a reader accepts: the mark
	// lists a scope's objects, and a hostile or runaway one must not
	// exhaust memory.
	maxMarkBytes = 16 << 20
	// maxTries bounds the compare-and-swaps of one write that lose to a
	// concurrent writer of the same scope whose write does not make this
	// one stale (the same epoch, or a follower's advance).
	maxTries = 32
	// maxReadTries bounds how often Get re-reads a mark whose object was
	// replaced (and its old version deleted) between the two reads.
	maxReadTries = 8
)

// markFile is the body of a mark object, JSON:
//
//	{"token":"42","seq":"3","commit":"9f…","objects":{"name":"KEY",…}}
//
// token and seq are decimal strings, as everywhere in fence's JSON, so a
// reader whose numbers are doubles keeps them exact. commit names the
// write that put this version, so a writer whose request was retried
// after it landed recognises its own write; and it makes every version's
// body, and so its ETag (a hash of the body on most servers), new: a
// compare-and-swap must never mistake a later version for the one it
// checked, as it would if a scope's mark went back to the same bytes.
type markFile struct {
	Token   uint64            `json:"token,string"`
	Seq     uint64            `json:"seq,string"`
	Commit  string            `json:"commit"`
	Objects map[string]string `json:"objects,omitempty"`
}

func (f *markFile) mark() guard.Mark { return guard.Mark{Token: f.Token, Seq: f.Seq} }

// marks reads and swaps the mark objects of one bucket under one prefix.
type marks struct {
	api    *s3.Client
	bucket string
	prefix string

	mu    sync.Mutex
	locks map[string]*scopeLock
}

type scopeLock struct {
	mu   sync.Mutex
	refs int
}

func newMarks(api *s3.Client, bucket, prefix string) *marks {
	return &marks{api: api, bucket: bucket, prefix: prefix, locks: map[string]*scopeLock{}}
}

// lock serializes this process's writes to one scope, so that they do not
// make each other's compare-and-swap fail; other processes are ordered by
// the swap itself. A scope's entry is dropped when nobody holds or waits
// for it, so the table stays as large as the scopes written at once.
func (m *marks) lock(scope string) (unlock func()) {
	m.mu.Lock()
	l := m.locks[scope]
	if l == nil {
		l = &scopeLock{}
		m.locks[scope] = l
	}
	l.refs++
	m.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.locks, scope)
		}
		m.mu.Unlock()
	}
}

// escape writes every byte of s other than ASCII letters, digits, '-' and
// '_' as '%' and two upper-case hex digits. The result holds no '/' or
// '.', so it is one path segment that no server normalises, whatever the
// scope; and it keeps prefixes, so a listing by an escaped prefix finds
// the scopes that start with it.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func (m *marks) markKey(scope string) string { return m.prefix + "marks/" + escape(scope) }
func (m *marks) dataDir(scope string) string { return m.prefix + "data/" + escape(scope) + "/" }

// newKey returns a data key that no other write uses: the token, the
// sequence and 128 random bits.
func (m *marks) newKey(w guard.Write) string {
	return fmt.Sprintf("%s%d-%d-%s", m.dataDir(w.Token.Scope), w.Token.Value, w.Seq, randomHex())
}

func randomHex() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// read returns scope's mark and its ETag; "" and a zero mark if it has
// none.
func (m *marks) read(ctx context.Context, scope string) (*markFile, string, error) {
	key := m.markKey(scope)
	out, err := m.api.GetObject(ctx, &s3.GetObjectInput{Bucket: &m.bucket, Key: &key})
	if status(err) == http.StatusNotFound {
		return &markFile{}, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read the mark of %q (s3://%s/%s): %w", scope, m.bucket, key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(io.LimitReader(out.Body, maxMarkBytes+1))
	if err != nil {
		return nil, "", fmt.Errorf("read the mark of %q (s3://%s/%s): %w", scope, m.bucket, key, err)
	}
	if len(data) > maxMarkBytes {
		return nil, "", fmt.Errorf("the mark of %q (s3://%s/%s) is over %d bytes", scope, m.bucket, key, maxMarkBytes)
	}
	etag := aws.ToString(out.ETag)
	if etag == "" {
		return nil, "", fmt.Errorf("the server sent the mark of %q without an ETag; s3guard needs conditional writes", scope)
	}
	f, err := parseMark(data)
	if err != nil {
		return nil, "", fmt.Errorf("the mark of %q (s3://%s/%s): %w", scope, m.bucket, key, err)
	}
	return f, etag, nil
}

// parseMark decodes a mark object strictly: a field it does not know, or
// a mark without a token, would be lost or misread when the next writer
// rewrites it.
func parseMark(data []byte) (*markFile, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if _, ok := raw["token"]; !ok {
		return nil, errors.New(`no "token"`)
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	var f markFile
	if err := d.Decode(&f); err != nil {
		return nil, err
	}
	return &f, nil
}

// swap replaces scope's mark, whose ETag was etag ("" for none), with f,
// and only if it is still that version. It reports whether the version
// had changed.
func (m *marks) swap(ctx context.Context, scope, etag string, f *markFile) (conflict bool, err error) {
	body, err := json.Marshal(f)
	if err != nil {
		return false, err
	}
	key := m.markKey(scope)
	in := &s3.PutObjectInput{
		Bucket: &m.bucket, Key: &key, Body: bytes.NewReader(body),
		ContentType: aws.String("application/json"),
	}
	if etag == "" {
		in.IfNoneMatch = aws.String("*")
	} else {
		in.IfMatch = aws.String(etag)
	}
	_, err = m.api.PutObject(ctx, in)
	switch status(err) {
	case 0:
		return false, nil
	case http.StatusPreconditionFailed, http.StatusConflict:
		// 409 is S3's answer to a conditional write racing another
		// on the same key: retry, as for 412.
		return true, nil
	}
	return false, fmt.Errorf("write the mark of %q (s3://%s/%s): %w", scope, m.bucket, key, err)
}

// status returns the HTTP status of a failed request, 0 for no error and
// -1 for an error that carries none: a refused connection, or an answer
// lost (the SDK then reports a response error of status 0).
func status(err error) int {
	if err == nil {
		return 0
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() > 0 {
		return re.HTTPStatusCode()
	}
	return -1
}

// errSuperseded is commit's report that apply ran but the write lost its
// swap to a newer one; it wraps the *guard.StaleError.
type errSuperseded struct{ stale *guard.StaleError }

func (e *errSuperseded) Error() string { return e.stale.Error() }
func (e *errSuperseded) Unwrap() error { return e.stale }

// commit is every write's one door: it reads scope's mark, refuses w if
// guard.Check does, calls apply (nil: none), and swaps the mark for
// guard.Next's with edit applied to its objects, conditional on the
// version read. When the swap loses to another writer it reads the mark
// again: if w is now stale it returns an *errSuperseded (apply ran),
// otherwise it swaps again, without calling apply again. old is the
// object map the winning swap replaced.
func (m *marks) commit(ctx context.Context, w guard.Write, strict bool, apply func(context.Context) error,
	edit func(objects map[string]string) error,
) (old map[string]string, err error) {
	scope := w.Token.Scope
	unlock := m.lock(scope)
	defer unlock()
	cur, etag, err := m.read(ctx, scope)
	if err != nil {
		return nil, err
	}
	if err := guard.Check(scope, cur.mark(), w, strict); err != nil {
		return nil, err
	}
	if apply != nil {
		if err := apply(ctx); err != nil {
			return nil, err
		}
	}
	id := randomHex()
	for try := 1; ; try++ {
		next := guard.Next(cur.mark(), w)
		f := &markFile{Token: next.Token, Seq: next.Seq, Commit: id, Objects: map[string]string{}}
		for k, v := range cur.Objects {
			f.Objects[k] = v
		}
		if edit != nil {
			if err := edit(f.Objects); err != nil {
				return nil, err
			}
		}
		conflict, err := m.swap(ctx, scope, etag, f)
		replaced := cur.Objects
		if err != nil {
			// No answer, or a server error: the swap may have landed.
			// If the mark is ours, it did; if not, it may still land
			// (a request in flight), so the outcome stays unknown.
			if s := status(err); s == -1 || s >= 500 {
				if now, _, rerr := m.read(ctx, scope); rerr == nil && now.Commit == id {
					return replaced, nil
				}
			}
			return nil, err
		}
		if !conflict {
			return replaced, nil
		}
		if cur, etag, err = m.read(ctx, scope); err != nil {
			return nil, err
		}
		if cur.Commit == id {
			// This try landed, and the SDK's retry of it was refused.
			return replaced, nil
		}
		if err := guard.Check(scope, cur.mark(), w, strict); err != nil {
			return nil, &errSuperseded{err.(*guard.StaleError)}
		}
		if try == maxTries {
			return nil, fmt.Errorf("the mark of %q changed under %d writes in a row; gave up", scope, try)
		}
		if err := sleep(ctx, try); err != nil {
			return nil, err
		}
	}
}

// sleep waits a random time that grows with try, up to 100ms, so writers
// that keep colliding spread out.
func sleep(ctx context.Context, try int) error {
	d := time.Duration(rand.Int64N(int64(min(time.Millisecond<<min(try, 7), 100*time.Millisecond)) + 1))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// scopes lists the scopes starting with prefix that have a mark.
func (m *marks) scopes(ctx context.Context, prefix string) ([]string, error) {
	dir := m.prefix + "marks/"
	in := &s3.ListObjectsV2Input{Bucket: &m.bucket, Prefix: aws.String(dir + escape(prefix))}
	var scopes []string
	for p := s3.NewListObjectsV2Paginator(m.api, in); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list the marks under s3://%s/%s: %w", m.bucket, *in.Prefix, err)
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			s, err := url.PathUnescape(strings.TrimPrefix(key, dir))
			if err != nil || escape(s) != strings.TrimPrefix(key, dir) {
				continue // not a mark s3guard wrote
			}
			scopes = append(scopes, s)
		}
	}
	return scopes, nil
}

func (m *marks) highest(ctx context.Context, scope string) (guard.Mark, error) {
	f, _, err := m.read(ctx, scope)
	if err != nil {
		return guard.Mark{}, err
	}
	return f.mark(), nil
}
