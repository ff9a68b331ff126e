package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/client"
)

// TestClusterPartitionWaiter cuts off a leader while a client waits in its
// line (issue 33, item 1). The cut-off leader steps down, but never applies
// the next leader's promote, which drops its line; its waiter must still
// be answered, "leader changed", so that the client retries at the new
// leader and is granted the scope there once the holder releases it.
func TestClusterPartitionWaiter(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	old := c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	held, err := admin.Grant(ctx, "w", client.WithTTL(time.Minute), client.WithHolder("holder"))
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's calls go to the leader first, not through a follower,
	// which would cancel a forwarded call when it hears of a new leader.
	addrs := []string{old.api}
	for _, nd := range c.others(old) {
		addrs = append(addrs, nd.api)
	}
	waiter := newClient(t, strings.Join(addrs, ","), client.WithRetryTimeout(30*time.Second))
	wctx, wcancel := context.WithTimeout(ctx, 45*time.Second)
	defer wcancel()
	type answer struct {
		token uint64
		err   error
	}
	done := make(chan answer, 1)
	go func() {
		l, err := waiter.Grant(wctx, "w", client.WithWait(), client.WithTTL(time.Minute), client.WithHolder("waiter"))
		done <- answer{l.Token, err}
	}()
	waitInLine(ctx, t, old, "w", 1)

	isolate(t, old.ip, true)
	rest := c.others(old)
	nl := c.leader(rest...)
	t.Logf("cut off the leader %s with a waiter in its line; %s leads the others", old.id, nl.id)
	var restAddrs []string
	for _, nd := range rest {
		restAddrs = append(restAddrs, nd.api)
	}
	majority := newClient(t, strings.Join(restAddrs, ","), client.WithRetryTimeout(30*time.Second))
	if _, err := majority.Release(ctx, "w", held.ID); err != nil {
		t.Fatal(err)
	}
	a := <-done // bounded by wctx
	if a.err != nil {
		t.Fatalf("the waiter of the cut-off leader, with the scope released at the new leader: %v; want granted there", a.err)
	}
	st, err := majority.Get(ctx, "w")
	if err != nil || st.Lease == nil || st.Lease.Token != a.token || st.Lease.Holder != "waiter" {
		t.Fatalf("scope w at the new leader: %+v, %v; want held by the waiter with token %d", st, err, a.token)
	}
	isolate(t, old.ip, false)
}

// TestClusterLeaderStopWaiters stops the leader with SIGTERM while clients
// wait in its line (issue 41, item 8). It hands the leadership over, and
// then must end every waiting call it has at once, so that its callers
// wait at the new leader instead, and exit: a rolling restart waits for
// it. That includes a call that reaches it after it handed over, on a
// connection opened before its listener closed: it was forwarded to the
// new leader and waited in line there, and the graceful shutdown waited
// for it until its 10 s deadline. The waiters are then granted the scope
// at the new leader one after another, each token once.
func TestClusterLeaderStopWaiters(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	old := c.leader()
	rest := c.others(old)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	held, err := admin.Grant(ctx, "q", client.WithTTL(time.Minute), client.WithHolder("holder"))
	if err != nil {
		t.Fatal(err)
	}

	// Each waiter releases the scope once granted, so the grants come one
	// at a time, in the order recorded.
	var mu sync.Mutex
	var grants []answer
	errs := make(chan error, 8)
	granted := func(who string, token uint64) {
		mu.Lock()
		grants = append(grants, answer{who, token})
		mu.Unlock()
	}
	var wg sync.WaitGroup
	const inLine = 3
	for i := range inLine {
		w := newClient(t, strings.Join([]string{old.api, rest[0].api, rest[1].api}, ","), client.WithRetryTimeout(30*time.Second))
		who := fmt.Sprintf("waiter-%d", i)
		wg.Go(func() {
			l, err := w.Grant(ctx, "q", client.WithWait(), client.WithTTL(time.Minute), client.WithHolder(who))
			if err != nil {
				errs <- fmt.Errorf("%s: %w", who, err)
				return
			}
			granted(who, l.Token)
			if _, err := w.Release(ctx, "q", l.ID); err != nil {
				errs <- fmt.Errorf("%s: release: %w", who, err)
			}
		})
	}
	waitInLine(ctx, t, old, "q", inLine)

	// Connections to the leader opened before its listener closes (a
	// client's TLS handshake under way, say), whose first request comes
	// once its graceful shutdown has begun. Until then they hold the
	// shutdown back, as net/http waits for a new connection's request.
	const late = 2
	var pre []net.Conn
	for range late {
		conn, err := net.Dial("tcp", old.api)
		if err != nil {
			t.Fatal(err)
		}
		pre = append(pre, conn)
	}
	defer func() {
		for _, conn := range pre {
			conn.Close()
		}
	}()

	old.p.signal(t, syscall.SIGTERM)
	stopped := time.Now()
	// Its listener closes once it has handed the leadership over, left
	// office, and begun to shut down.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		conn, err := net.Dial("tcp", old.api)
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(end) {
			t.Fatal("the stopped leader's listener still accepts 10s after SIGTERM")
		}
	}
	nl := c.leader(rest...)
	// Waiting acquires over HTTP/2 (as the Go client's shared connection,
	// or any client over TLS, sends them) reach it now. It must end them
	// at once, for their callers to wait at the new leader, and not keep
	// them or their connections open: the shutdown's GOAWAY missed these.
	lateErrs := make(chan error, late)
	for i := range late {
		rpc := fencev1connect.NewLeaseServiceClient(overConn(pre[i]), "http://"+old.api)
		go func() {
			_, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "q", Wait: true, Holder: fmt.Sprintf("late-%d", i), RequestId: fmt.Sprintf("late-%d", i), Ttl: durationpb.New(time.Minute)}))
			lateErrs <- err
		}()
	}

	select {
	case <-old.p.exit:
	case <-time.After(time.Until(stopped.Add(10 * time.Second))):
		old.p.signal(t, syscall.SIGQUIT)
		<-old.p.exit
		b, _ := os.ReadFile(old.p.log)
		t.Fatalf("the leader did not exit within 10s of SIGTERM, with waiters in line; its goroutines:\n%s", b)
	}
	t.Logf("the leader exited %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	if code := old.p.cmd.ProcessState.ExitCode(); code != 0 {
		b, _ := os.ReadFile(old.p.log)
		t.Fatalf("the stopped leader exited with status %d, want 0 (it cut calls off at its shutdown deadline)\n%s", code, b)
	}
	for range late {
		select {
		case err := <-lateErrs:
			// Unavailable: a client retries at another node.
			if connect.CodeOf(err) != connect.CodeUnavailable {
				t.Errorf("a waiting acquire sent to the leader after it handed over: %v; want it ended, to retry at the new leader", err)
			}
		case <-ctx.Done():
			t.Fatal("a waiting acquire sent to the leader after it handed over was not answered")
		}
	}

	// The late waiters retry at the new leader, as a client does.
	for i := range late {
		who := fmt.Sprintf("late-%d", i)
		wg.Go(func() {
			rpc := fencev1connect.NewLeaseServiceClient(h2cClient, "http://"+nl.api)
			r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "q", Wait: true, Holder: who, RequestId: who, Ttl: durationpb.New(time.Minute)}))
			if err != nil {
				errs <- fmt.Errorf("%s at the new leader: %w", who, err)
				return
			}
			granted(who, r.Msg.Lease.Token)
			if _, err := rpc.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: "q", LeaseId: r.Msg.Lease.LeaseId})); err != nil {
				errs <- fmt.Errorf("%s: release: %w", who, err)
			}
		})
	}
	waitInLine(ctx, t, nl, "q", inLine+late)
	if _, err := admin.Release(ctx, "q", held.ID); err != nil {
		t.Fatal(err)
	}
	wg.Wait() // bounded by ctx
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	last, who := held.Token, map[string]bool{}
	for _, g := range grants {
		if g.token <= last || who[g.holder] {
			t.Errorf("grants in order: %+v; want each waiter once, tokens rising above the holder's %d", grants, held.Token)
			break
		}
		last, who[g.holder] = g.token, true
	}
	if len(grants) != inLine+late {
		t.Errorf("%d waiters granted, want %d: %+v", len(grants), inLine+late, grants)
	}
}

// waitInLine waits until nd's line for scope has n waiters.
func waitInLine(ctx context.Context, t *testing.T, nd *clusterNode, scope string, n uint32) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := direct(nd).Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: scope}))
		if err == nil && r.Msg.Waiters == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d waiters not in %s's line for %s after 20s: %v", n, nd.id, scope, err)
		}
	}
}

// answer is a waiter's grant.
type answer struct {
	holder string
	token  uint64
}

// overConn is an HTTP/2 (h2c) client whose requests go over conn.
func overConn(conn net.Conn) *http.Client {
	var once sync.Once
	t := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		used := errors.New("the connection is used")
		once.Do(func() { used = nil })
		if used != nil {
			return nil, used
		}
		return conn, nil
	}}
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: t}
}
