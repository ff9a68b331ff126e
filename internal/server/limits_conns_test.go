package server

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/fsm"
)

// The attackers dial from loopback addresses of their own (Linux routes
// all of 127.0.0.0/8 to lo), as other machines would; the ordinary client
// dials from 127.0.0.1.

func dialFrom(t testing.TB, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// h2Hello opens an HTTP/2 connection as an idle client does (the preface
// and SETTINGS, then nothing) and reports whether the server answered with
// its SETTINGS (kept) or closed the connection (refused).
func h2Hello(c net.Conn) (kept bool) {
	fr := http2.NewFramer(c, c)
	c.Write([]byte(http2.ClientPreface))
	fr.WriteSettings()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	_, err := fr.ReadFrame()
	return err == nil
}

// acquireLatencies times n ordinary acquires (and releases), each of which
// must succeed within its own 10 s context.
func acquireLatencies(t *testing.T, rpc fencev1connect.LeaseServiceClient, name string, n int) []time.Duration {
	t.Helper()
	var ds []time.Duration
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: fmt.Sprint("ordinary/", i), Holder: "ordinary"}))
		ds = append(ds, time.Since(start))
		if err != nil {
			cancel()
			t.Fatalf("%s: an ordinary acquire: %v", name, err)
		}
		_, err = rpc.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: r.Msg.Lease.Scope, LeaseId: r.Msg.Lease.LeaseId}))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(ds)
	t.Logf("%s: %d acquires, median %v, max %v", name, n, ds[n/2].Round(10*time.Microsecond), ds[n-1].Round(10*time.Microsecond))
	return ds
}

// TestConnectionLimits: connections from one address beyond
// MaxConnsPerAddr, and any beyond MaxConns, are closed as soon as
// accepted, while an ordinary client's acquires go on being served; once
// the attackers leave, their places are free again.
func TestConnectionLimits(t *testing.T) {
	const perAddr, total = 100, 250
	s := startWith(t, func(c *Config) { c.MaxConns, c.MaxConnsPerAddr = total, perAddr })
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	// The metrics, as /metrics would show them.
	metric := func(name string, labels ...string) float64 {
		t.Helper()
		fams, err := s.metrics.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.Metric {
				if len(labels) == 0 || len(m.Label) == 1 && m.Label[0].GetName() == labels[0] && m.Label[0].GetValue() == labels[1] {
					return m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
		t.Fatalf("no metric %s%v", name, labels)
		return 0
	}
	acquireLatencies(t, rpc, "before", 50) // also opens the client's one connection

	// One address opens half again as many idle connections as it may.
	var attack []net.Conn
	for i := range perAddr * 3 / 2 {
		c := dialFrom(t, "127.0.0.2", s.Addr())
		if kept := h2Hello(c); kept != (i < perAddr) {
			t.Fatalf("idle connection %d from one address: kept %v, want %v (the limit per address is %d)", i, kept, i < perAddr, perAddr)
		}
		attack = append(attack, c)
	}
	acquireLatencies(t, rpc, "during an idle-connection flood from one address", 50)

	// Other addresses fill the server: 1 + 100 open, 149 more fit.
	for i := range total - 1 - perAddr {
		c := dialFrom(t, fmt.Sprint("127.0.0.", 3+i/perAddr), s.Addr())
		if !h2Hello(c) {
			t.Fatalf("connection %d of %d: refused below the server's limit", 1+perAddr+i+1, total)
		}
		attack = append(attack, c)
	}
	if h2Hello(dialFrom(t, "127.0.0.9", s.Addr())) {
		t.Fatalf("a connection beyond the server's limit of %d was kept", total)
	}
	acquireLatencies(t, rpc, "with every connection taken, on the client's own", 50)
	if open := metric("fence_connections_open"); open != total {
		t.Errorf("fence_connections_open = %v with every place taken, want %d", open, total)
	}
	if n := metric("fence_connections_refused_total", "limit", "max-conns-per-addr"); n != perAddr/2 {
		t.Errorf("refused by max-conns-per-addr: %v, want the %d beyond the limit", n, perAddr/2)
	}
	if n := metric("fence_connections_refused_total", "limit", "max-conns"); n != 1 {
		t.Errorf("refused by max-conns: %v, want 1", n)
	}

	for _, c := range attack {
		c.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); !h2Hello(dialFrom(t, "127.0.0.9", s.Addr())); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the attackers' places were not given back once they closed")
		}
	}
	if open := metric("fence_connections_open"); open >= total {
		t.Errorf("fence_connections_open = %v once the attackers left, want fewer than %d", open, total)
	}
}

// slowSender sends one request on a connection of its own a byte at a
// time, and reports, once the server closes the connection, whether the
// server said GOAWAY first.
type slowSender struct {
	c       net.Conn
	closed  chan struct{}
	goAway  bool
	readErr error
}

func sendSlowly(t *testing.T, from, addr string, h2 bool) *slowSender {
	c := dialFrom(t, from, addr)
	s := &slowSender{c: c, closed: make(chan struct{})}
	var mu sync.Mutex // the framer's writes
	fr := http2.NewFramer(c, c)
	var send func() error
	if h2 {
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
			{":path", fencev1connect.LeaseServiceAcquireProcedure}, {"content-type", "application/json"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		c.Write([]byte(http2.ClientPreface))
		fr.WriteSettings()
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
		send = func() error {
			mu.Lock()
			defer mu.Unlock()
			return fr.WriteData(1, false, []byte(" "))
		}
	} else {
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", fencev1connect.LeaseServiceAcquireProcedure, addr)
		send = func() error { _, err := c.Write([]byte(" ")); return err }
	}
	go func() {
		for send() == nil {
			select {
			case <-s.closed:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	go func() {
		defer close(s.closed)
		if !h2 {
			_, s.readErr = io.Copy(io.Discard, c)
			return
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				s.readErr = err
				return
			}
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				s.goAway = true
			case *http2.SettingsFrame:
				if !f.IsAck() {
					mu.Lock()
					fr.WriteSettingsAck()
					mu.Unlock()
				}
			}
		}
	}()
	return s
}

// TestSlowBodies: requests whose bodies come a byte at a time fail once
// the read timeout passes, and their connections are closed (HTTP/2: after
// a GOAWAY), while ordinary acquires are served; a watch quiet for longer
// than the timeout, and an acquire that waits longer, are not cut.
func TestSlowBodies(t *testing.T) {
	const readTimeout = time.Second
	s := startWith(t, func(c *Config) { c.ReadTimeout = readTimeout })
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acquireLatencies(t, rpc, "before", 50)

	watch, err := rpc.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: "quiet/"}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() {
		t.Fatal(watch.Err())
	}
	// Two acquires wait past the read timeout, one over HTTP/2, one over
	// HTTP/1.1 in JSON.
	var held []*fencev1.Lease
	for _, scope := range []string{"waited/h2", "waited/h1"} {
		r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: scope, Holder: "first"}))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r.Msg.Lease)
	}
	waited := make(chan error, 2)
	go func() {
		_, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "waited/h2", Holder: "patient", Wait: true}))
		waited <- err
	}()
	go func() {
		resp, err := http.Post("http://"+s.Addr()+fencev1connect.LeaseServiceAcquireProcedure, "application/json",
			strings.NewReader(`{"scope":"waited/h1","holder":"patient","wait":true}`))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("HTTP/1.1: %s %s", resp.Status, b)
			}
		}
		waited <- err
	}()

	// 200 connections, as in the probe that found this, a fifth HTTP/1.1.
	var senders []*slowSender
	for i := range 200 {
		senders = append(senders, sendSlowly(t, "127.0.0.2", s.Addr(), i%5 != 0))
	}
	acquireLatencies(t, rpc, "during 200 slow bodies", 50)
	for i, sl := range senders {
		select {
		case <-sl.closed:
		case <-time.After(20 * readTimeout):
			t.Fatalf("slow sender %d: its connection is still open %v after its read timeout of %v", i, 20*readTimeout, readTimeout)
		}
		if h2 := i%5 != 0; h2 && !sl.goAway {
			t.Errorf("slow sender %d: its HTTP/2 connection closed (%v) without a GOAWAY", i, sl.readErr)
		}
	}

	// The waits and the watch outlived the read timeout: all still work.
	for _, l := range held {
		if _, err := rpc.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: l.Scope, LeaseId: l.LeaseId})); err != nil {
			t.Fatal(err)
		}
	}
	for range held {
		if err := <-waited; err != nil {
			t.Fatalf("an acquire that waited past the read timeout: %v", err)
		}
	}
	if _, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "quiet/a", Holder: "h"})); err != nil {
		t.Fatal(err)
	}
	for watch.Receive() && len(watch.Msg().Events) == 0 {
	}
	if watch.Err() != nil || len(watch.Msg().Events) == 0 || watch.Msg().Events[0].Scope != "quiet/a" {
		t.Fatalf("a watch quiet for longer than the read timeout: %v, %v; want the grant of quiet/a", watch.Msg(), watch.Err())
	}
}

// TestOversizedBodyIs413: a request body above the limit is answered 413,
// whether its length was announced or not, over HTTP/1.1 and HTTP/2,
// still with Connect's resource_exhausted in the body; a limit of leases
// stays 429, a request that may succeed later.
func TestOversizedBodyIs413(t *testing.T) {
	s := startWith(t, func(c *Config) { c.MaxLeasesPerIdentity = 1 })
	huge := `{"scope":"` + strings.Repeat("a", int(requestLimit(fencev1connect.LeaseServiceAcquireProcedure))) + `"}`
	post := func(client *http.Client, body io.Reader) (int, string) {
		t.Helper()
		resp, err := client.Post("http://"+s.Addr()+fencev1connect.LeaseServiceAcquireProcedure, "application/json", body)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		name   string
		client *http.Client
	}{{"HTTP/1.1", http.DefaultClient}, {"HTTP/2", h2cClient(0)}} {
		for _, length := range []bool{true, false} {
			body := io.Reader(strings.NewReader(huge))
			if !length {
				body = io.MultiReader(body) // hides the length: chunked, or no content-length
			}
			code, msg := post(c.client, body)
			if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, `"resource_exhausted"`) {
				t.Errorf("%s, length given %v: %d %.200s; want 413 and resource_exhausted", c.name, length, code, msg)
			}
		}
	}
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if code, msg := post(http.DefaultClient, strings.NewReader(fmt.Sprintf(`{"scope":"s/%d","holder":"one"}`, i))); code != want {
			t.Errorf("acquire %d of a holder allowed 1 lease: %d %.200s; want %d", i+1, code, msg, want)
		}
	}
}

// TestGzipBombIs413: a gzip body that inflates far beyond the request limit
// is inflated no further than the limit and answered 413 (over gRPC,
// resource_exhausted), not inflated whole to name its size, which cost a
// quarter of a second of CPU per 1,000 MiB before authentication. A
// compressed request within the limit is served, and a compressed one
// refused by a limit of leases stays 429.
func TestGzipBombIs413(t *testing.T) {
	s := startWith(t, func(c *Config) { c.MaxLeasesPerIdentity = 1 })
	const inflated = 16 << 20
	post := func(body []byte) (int, string) {
		t.Helper()
		return postBody(t, s.Addr(), fencev1connect.LeaseServiceAcquireProcedure, "application/json", gzipped(body), "gzip")
	}
	bomb := make([]byte, inflated)
	if n := len(gzipped(bomb)); n > int(requestLimit(fencev1connect.LeaseServiceAcquireProcedure)) {
		t.Fatalf("the bomb is %d bytes compressed, over the limit itself", n)
	}
	code, msg := post(bomb)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, `"resource_exhausted"`) || strings.Contains(msg, fmt.Sprint(inflated)) {
		t.Errorf("%d bytes of gzip inflating to %d: %d %.300s; want 413, resource_exhausted, and no inflated size (it was inflated whole to name it)", len(bomb), inflated, code, msg)
	}

	grpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr(), connect.WithGRPC(), connect.WithSendGzip())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := grpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: strings.Repeat("a", inflated)}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "inflates beyond the request limit of") {
		t.Errorf("over gRPC, a message inflating to %d: %v; want resource_exhausted, %q", inflated, err, inflatedTooLarge)
	}
	if _, err := grpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: "small"})); err != nil {
		t.Errorf("a small gzipped request over gRPC: %v", err)
	}

	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if code, msg := post(fmt.Appendf(nil, `{"scope":"s/%d","holder":"one"}`, i)); code != want {
			t.Errorf("gzipped acquire %d of a holder allowed 1 lease: %d %.200s; want %d", i+1, code, msg, want)
		}
	}
}

// TestZeroWindowAnswerIsCut: an HTTP/2 client that asks for an answer and
// gives it no flow-control window has its stream reset once the answer
// cannot be written for the write timeout. A unary answer is small and
// is sent after its handler returns, where no write deadline covered it:
// the stream, and the goroutine writing it, waited for ever.
func TestZeroWindowAnswerIsCut(t *testing.T) {
	s := startWith(t, func(c *Config) { c.WriteTimeout = 300 * time.Millisecond })
	c := dialFrom(t, "127.0.0.1", s.Addr())
	fr := http2.NewFramer(c, c)
	c.Write([]byte(http2.ClientPreface))
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", s.Addr()},
		{":path", fencev1connect.LeaseServiceGetProcedure}, {"content-type", "application/json"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	fr.WriteData(1, true, []byte(`{"scope":"a"}`))

	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no reset of the stream whose answer waits on a zero window: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.DataFrame:
			if len(f.Data()) > 0 {
				t.Fatalf("the server sent %d bytes of data into a zero window", len(f.Data()))
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return
			}
		}
	}
}

// TestConnectionsCountedByHost: --max-conns-per-addr counts an IPv4
// address on its own and an IPv6 address with the rest of its /64, which
// one host commonly holds whole; an IPv4-mapped IPv6 address counts as the
// IPv4 one.
func TestConnectionsCountedByHost(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:fffe", true},
		{"2001:db8:1:2::1", "2001:db8:1:3::1", false},
		{"fe80::1%eth0", "fe80::2%eth1", true},
		{"127.0.0.2", "127.0.0.3", false},
		{"::ffff:127.0.0.2", "127.0.0.2", true},
		{"::ffff:127.0.0.2", "::1", false},
	} {
		ka, kb := addrKey(netip.MustParseAddr(tc.a)), addrKey(netip.MustParseAddr(tc.b))
		if (ka == kb) != tc.same {
			t.Errorf("%s counted as %s, %s as %s; want the same count: %v", tc.a, ka, tc.b, kb, tc.same)
		}
	}
}

// TestBatchLimits: each batch RPC reads, inflates and decodes no more than
// its largest valid request, its item limit times its largest item, not a
// limit shared by every RPC. A full batch of the longest items is served,
// as protobuf and as JSON; a batch of 524,280 empty items (1 MiB of
// protobuf, 1 KB gzipped), which took 150 ms of CPU and 50 MB to decode
// before its count was refused, is refused 413 once it passes the limit,
// gzipped or not, as is a JSON one of 1 MiB.
func TestBatchLimits(t *testing.T) {
	s := startWith(t, func(*Config) {})
	post := func(path, ctype string, body []byte, gzip bool) (int, string) {
		t.Helper()
		if gzip {
			return postBody(t, s.Addr(), path, ctype, gzipped(body), "gzip")
		}
		return postBody(t, s.Addr(), path, ctype, body, "")
	}
	pad := func(s string, n int) string { return s + strings.Repeat("a", n-len(s)) }
	acquires, renewals, releases := &fencev1.AcquireBatchRequest{}, &fencev1.RenewBatchRequest{Leases: true}, &fencev1.ReleaseBatchRequest{}
	report := &fencev1.ReportRejectionsRequest{Guard: pad("g", maxGuardName), Dropped: 1 << 62}
	for i := range maxBatch {
		scope := pad(fmt.Sprintf("big/%04d/", i), fence.MaxScopeLen)
		acquires.Acquires = append(acquires.Acquires, &fencev1.AcquireRequest{Scope: scope, Holder: pad("h", fence.MaxHolderLen),
			Ttl: durationpb.New(299*time.Second + 999999999), RequestId: pad(fmt.Sprint(i), fsm.MaxRequestIDLen)})
		renewals.Renewals = append(renewals.Renewals, &fencev1.RenewRequest{Scope: scope, LeaseId: strings.Repeat("f", 32)})
		releases.Releases = append(releases.Releases, &fencev1.ReleaseRequest{Scope: scope, LeaseId: strings.Repeat("f", 32)})
		report.Rejections = append(report.Rejections, &fencev1.Rejection{Scope: scope, PresentedToken: fence.MaxToken - 1, HighestToken: fence.MaxToken,
			Time: timestamppb.New(time.Date(2026, 12, 31, 23, 59, 59, 999999999, time.UTC))})
	}
	for path, m := range map[string]proto.Message{
		fencev1connect.LeaseServiceAcquireBatchProcedure:     acquires,
		fencev1connect.LeaseServiceRenewBatchProcedure:       renewals,
		fencev1connect.LeaseServiceReleaseBatchProcedure:     releases,
		fencev1connect.LeaseServiceReportRejectionsProcedure: report,
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		j, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, body := range []struct {
			ctype string
			b     []byte
		}{{"application/proto", b}, {"application/json", j}} {
			if code, msg := post(path, body.ctype, body.b, false); code != http.StatusOK {
				t.Errorf("%s, a full batch of the longest items, %d bytes of %s: %d %.300s; want it served", path, len(body.b), body.ctype, code, msg)
			}
		}
		if limit := requestLimit(path); limit >= 1<<20 || limit < int64(len(j)) {
			t.Errorf("%s: a limit of %d bytes; want its largest request's (%d bytes of JSON), under the 1 MiB every RPC had", path, limit, len(j))
		}
	}

	path := fencev1connect.LeaseServiceAcquireBatchProcedure
	empty, err := proto.Marshal(&fencev1.AcquireBatchRequest{Acquires: make([]*fencev1.AcquireRequest, 524280)})
	if err != nil {
		t.Fatal(err)
	}
	emptyJSON := []byte(`{"acquires":[{}` + strings.Repeat(`,{}`, (1<<20)/3) + `]}`)
	for _, c := range []struct {
		name, ctype string
		body        []byte
		gzipped     bool
		says        string
	}{
		{"protobuf", "application/proto", empty, false, fmt.Sprintf("is larger than configured max %d", requestLimit(path))},
		{"gzipped protobuf", "application/proto", empty, true, fmt.Sprintf("inflates beyond the request limit of %d bytes", requestLimit(path))},
		{"gzipped JSON", "application/json", emptyJSON, true, fmt.Sprintf("inflates beyond the request limit of %d bytes", requestLimit(path))},
	} {
		if code, msg := post(path, c.ctype, c.body, c.gzipped); code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, `"resource_exhausted"`) || !strings.Contains(msg, c.says) {
			t.Errorf("AcquireBatch, %d bytes of %s of empty items: %d %.300s; want 413, resource_exhausted, %q", len(c.body), c.name, code, msg, c.says)
		}
	}
}

// postBody posts body to the path of the server at addr as ctype, in
// encoding if not "", and returns the answer's status and body.
func postBody(t *testing.T, addr, path, ctype string, body []byte, encoding string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}
