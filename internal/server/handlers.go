package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/authz"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/lessor"
	"github.com/fence-dev/fence/internal/wire"
)

const (
	defaultPageSize = 1000
	maxPageSize     = 1000
)

// errNotReady answers requests while the node is not a serving leader.
var errNotReady = fmt.Errorf("%w: not ready (starting up, or not the leader); retry shortly", fence.ErrUnavailable)

func (s *Server) checkReady() error {
	if !s.lessor.Ready() {
		return errNotReady
	}
	return nil
}

// Acquire implements fence.v1.LeaseService.Acquire.
func (s *Server) Acquire(ctx context.Context, req *connect.Request[fencev1.AcquireRequest]) (*connect.Response[fencev1.AcquireResponse], error) {
	c, err := s.acquireCommand(ctx, req.Msg)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	r, err := s.lessor.Acquire(ctx, c)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	if r.Outcome != fsm.Granted {
		return nil, wire.ToConnect(s.outcomeError(r))
	}
	return connect.NewResponse(&fencev1.AcquireResponse{Lease: s.lease(r.Scope, r.Lease, true)}), nil
}

// acquireCommand stamps and validates the command of one acquire.
func (s *Server) acquireCommand(ctx context.Context, m *fencev1.AcquireRequest) (fsm.Command, error) {
	if m.Ttl != nil {
		// AsDuration would fold nanos outside ±1s into the seconds, and
		// clamp a too-large value, granting a TTL nobody asked for.
		if err := m.Ttl.CheckValid(); err != nil {
			return fsm.Command{}, &fence.InvalidError{Field: "ttl", Reason: fmt.Sprintf("%v: outside the allowed range %v to %v", err, s.cfg.MinTTL, s.cfg.MaxTTL)}
		}
	}
	ttl, err := s.ttl(m.Ttl.AsDuration(), m.Ttl != nil)
	if err != nil {
		return fsm.Command{}, err
	}
	c := fsm.Command{
		Op: fsm.OpAcquire, Scope: m.Scope, LeaseID: fence.NewLeaseID(), Holder: m.Holder,
		TTL: ttl, Wait: m.Wait, RequestID: m.RequestId, At: time.Now().UnixNano(),
		MaxWaiters: s.cfg.MaxWaiters, Owner: authz.Identity(ctx),
	}
	if err := c.Validate(); err != nil {
		return fsm.Command{}, err
	}
	c.RequestID = retryKey(c.Owner, c.Holder, c.RequestID)
	return c, nil
}

// retryKey is the request ID an acquire is recorded under: the client's,
// bound to the acquire's owner (the identity with auth on, the holder
// with auth off), so that it matches only that owner's own retries. The
// state machine binds a retry to the holder, which anyone may read (Get,
// List, watch, the status page); it answered whoever named the holder with
// the grant, lease ID and signed token, and whoever did not with "already
// used by another holder", telling a prober which request IDs exist. Keyed
// by owner, another caller's request ID is a fresh one: its acquire is
// answered as any other, whether or not that ID was used.
//
// The key is 128 bits of SHA-256 over the owner and the request ID, in
// unpadded base64url (22 bytes, the size of the Go client's own request
// IDs). Finding another owner's request ID that gives the same key takes
// some 2^128 tries.
func retryKey(identity, holder, requestID string) string {
	if requestID == "" {
		return ""
	}
	kind, owner := "identity", identity
	if identity == "" {
		kind, owner = "holder", holder
	}
	h := sha256.New()
	for _, part := range []string{"fence-request-id-v1", kind, owner, requestID} {
		h.Write(binary.AppendUvarint(nil, uint64(len(part))))
		h.Write([]byte(part))
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}

// maxBatch bounds the items of one AcquireBatch or ReleaseBatch request.
const maxBatch = fsm.MaxBatch

// batchSize refuses a batch call of no items or too many.
func batchSize(field string, n int) error {
	if n == 0 || n > maxBatch {
		return &fence.InvalidError{Field: field, Reason: fmt.Sprintf("%d in one batch, want 1 to %d", n, maxBatch)}
	}
	return nil
}

// AcquireBatch implements fence.v1.LeaseService.AcquireBatch: each acquire
// is checked and authorized on its own, as Acquire would check it, and
// the ones that pass are proposed together, as one log entry.
func (s *Server) AcquireBatch(ctx context.Context, req *connect.Request[fencev1.AcquireBatchRequest]) (*connect.Response[fencev1.AcquireBatchResponse], error) {
	as := req.Msg.Acquires
	if err := batchSize("acquires", len(as)); err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	out := make([]*fencev1.AcquireResult, len(as))
	cs := make([]fsm.Command, 0, len(as))
	at := make([]int, 0, len(as)) // cs[j] is the acquire as[at[j]]
	for i, m := range as {
		c, err := s.acquireCommand(ctx, m)
		if err == nil && c.Wait {
			err = &fence.InvalidError{Field: "wait", Reason: "a waiting acquire cannot be batched: call Acquire"}
		}
		if err == nil {
			err = s.auth.Allowed(ctx, "acquire", c.Scope)
		}
		if err != nil {
			out[i] = &fencev1.AcquireResult{Failure: wire.ToFailure(err)}
			continue
		}
		cs = append(cs, c)
		at = append(at, i)
	}
	if len(cs) > 0 {
		rs, err := s.lessor.Batch(ctx, cs)
		if err != nil {
			return nil, wire.ToConnect(err)
		}
		inParallel(len(rs), func(j int) {
			r := rs[j]
			if r.Outcome != fsm.Granted {
				out[at[j]] = &fencev1.AcquireResult{Failure: wire.ToFailure(s.outcomeError(r))}
				return
			}
			out[at[j]] = &fencev1.AcquireResult{Lease: s.lease(r.Scope, r.Lease, true)}
		})
	}
	return connect.NewResponse(&fencev1.AcquireBatchResponse{Results: out}), nil
}

// inParallel calls f for every index below n, spread over the cores once n
// is large enough to pay for the goroutines. Signing a batch's grants one
// after another (some 20 µs each) kept every caller in the batch waiting
// on one core while the other idled (eda15be:BENCHMARKS.md, "Signing a batch").
func inParallel(n int, f func(i int)) {
	const minPerWorker = 4
	workers := min(runtime.GOMAXPROCS(0), n/minPerWorker)
	if workers < 2 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	work := func() {
		for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
			f(i)
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}

// ReleaseBatch implements fence.v1.LeaseService.ReleaseBatch: each release
// is checked and authorized on its own, and the ones that pass are
// proposed together, as one log entry.
func (s *Server) ReleaseBatch(ctx context.Context, req *connect.Request[fencev1.ReleaseBatchRequest]) (*connect.Response[fencev1.ReleaseBatchResponse], error) {
	rs := req.Msg.Releases
	if err := batchSize("releases", len(rs)); err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	out := make([]*fencev1.ReleaseResult, len(rs))
	cs := make([]fsm.Command, 0, len(rs))
	at := make([]int, 0, len(rs))
	now := time.Now().UnixNano()
	for i, m := range rs {
		scope, id, err := scopeAndID(m.Scope, m.LeaseId)
		if err == nil {
			err = s.auth.Allowed(ctx, "release", scope)
		}
		if err != nil {
			out[i] = &fencev1.ReleaseResult{Failure: wire.ToFailure(err)}
			continue
		}
		cs = append(cs, fsm.Command{Op: fsm.OpRelease, Scope: scope, LeaseID: id, At: now})
		at = append(at, i)
	}
	if len(cs) > 0 {
		results, err := s.lessor.Batch(ctx, cs)
		if err != nil {
			return nil, wire.ToConnect(err)
		}
		for j, r := range results {
			if r.Outcome != fsm.Released {
				out[at[j]] = &fencev1.ReleaseResult{Failure: wire.ToFailure(s.outcomeError(r))}
				continue
			}
			out[at[j]] = &fencev1.ReleaseResult{Token: r.Lease.Token}
		}
	}
	return connect.NewResponse(&fencev1.ReleaseBatchResponse{Results: out}), nil
}

// Renew implements fence.v1.LeaseService.Renew.
func (s *Server) Renew(ctx context.Context, req *connect.Request[fencev1.RenewRequest]) (*connect.Response[fencev1.RenewResponse], error) {
	scope, id, err := scopeAndID(req.Msg.Scope, req.Msg.LeaseId)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	asked := []lessor.Renewal{{Scope: scope, ID: id}}
	decided := make([]lessor.Renewed, 1)
	if err := s.extend(ctx, asked, decided); err != nil {
		return nil, wire.ToConnect(err)
	}
	r := decided[0].Result
	if r.Outcome != fsm.Granted {
		return nil, wire.ToConnect(s.outcomeError(r))
	}
	s.confirmed(ctx, asked, decided)
	return connect.NewResponse(&fencev1.RenewResponse{Lease: s.lease(scope, r.Lease, true)}), nil
}

// maxRenewBatch bounds the renewals of one RenewBatch request.
const maxRenewBatch = 1000

// RenewBatch implements fence.v1.LeaseService.RenewBatch: each renewal is
// authorized and decided as Renew decides it, and one leadership check
// covers them all.
func (s *Server) RenewBatch(ctx context.Context, req *connect.Request[fencev1.RenewBatchRequest]) (*connect.Response[fencev1.RenewBatchResponse], error) {
	rs := req.Msg.Renewals
	if len(rs) == 0 || len(rs) > maxRenewBatch {
		return nil, wire.ToConnect(&fence.InvalidError{Field: "renewals", Reason: fmt.Sprintf("%d in one batch, want 1 to %d", len(rs), maxRenewBatch)})
	}
	// The lessor's answers are read where they are, not copied beside
	// each renewal: that copy was a third of the bytes a call allocated.
	refused := make([]error, len(rs)) // refused before the lessor looks
	asked := make([]lessor.Renewal, 0, len(rs))
	at := make([]int, 0, len(rs)) // asked[j] is rs[at[j]]
	for i, r := range rs {
		scope, id, err := scopeAndID(r.Scope, r.LeaseId)
		if err != nil {
			var inv *fence.InvalidError
			if errors.As(err, &inv) {
				err = &fence.InvalidError{Field: fmt.Sprintf("renewals[%d].%s", i, inv.Field), Reason: inv.Reason}
			}
			return nil, wire.ToConnect(err)
		}
		if refused[i] = s.auth.Allowed(ctx, "renew", scope); refused[i] == nil {
			asked = append(asked, lessor.Renewal{Scope: scope, ID: id})
			at = append(at, i)
		}
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	pooled := renewedPool.Get().(*[]lessor.Renewed)
	defer func() {
		clear(*pooled) // no lease kept alive by the pool
		renewedPool.Put(pooled)
	}()
	*pooled = slices.Grow((*pooled)[:0], len(asked))[:len(asked)]
	decided := *pooled
	if err := s.extend(ctx, asked, decided); err != nil {
		return nil, wire.ToConnect(err)
	}
	// The results in one allocation rather than one each.
	results := make([]fencev1.RenewResult, len(rs))
	out := make([]*fencev1.RenewResult, len(rs))
	for i, err := range refused {
		out[i] = &results[i]
		if err != nil {
			results[i].Failure = wire.ToFailure(err)
		}
	}
	// One duration for the results of the same TTL, as a batch's usually
	// all are, not one each: marshalling only reads it.
	var expiresIn *durationpb.Duration
	for j, r := range decided {
		scope, res := asked[j].Scope, &results[at[j]]
		if r.Outcome != fsm.Granted {
			res.Failure = wire.ToFailure(s.outcomeError(r.Result))
			continue
		}
		if expiresIn == nil || expiresIn.AsDuration() != r.TTL {
			expiresIn = durationpb.New(r.TTL)
		}
		res.ExpiresIn = expiresIn
		if req.Msg.Leases {
			res.Lease = s.lease(scope, r.Lease, true)
		}
	}
	s.confirmed(ctx, asked, decided)
	return connect.NewResponse(&fencev1.RenewBatchResponse{Results: out}), nil
}

// renewedPool holds the lessor's answers to a RenewBatch call between
// calls: some 200 bytes a renewal, the largest garbage a call made.
var renewedPool = sync.Pool{New: func() any { return new([]lessor.Renewed) }}

// extend renews each lease as lessor.RenewBatch does, into out, and
// publishes those found lost as such. On an error, the lessor could not
// confirm that this node still leads, and no renewal may be confirmed.
func (s *Server) extend(ctx context.Context, rs []lessor.Renewal, out []lessor.Renewed) error {
	err := s.lessor.RenewBatch(ctx, rs, out)
	for _, r := range out {
		if r.Outcome != fsm.Granted {
			s.renewRefused(r.Result)
		}
	}
	return err
}

// Release implements fence.v1.LeaseService.Release.
func (s *Server) Release(ctx context.Context, req *connect.Request[fencev1.ReleaseRequest]) (*connect.Response[fencev1.ReleaseResponse], error) {
	scope, id, err := scopeAndID(req.Msg.Scope, req.Msg.LeaseId)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	r, err := s.lessor.Release(ctx, scope, id)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	if r.Outcome != fsm.Released {
		return nil, wire.ToConnect(s.outcomeError(r))
	}
	return connect.NewResponse(&fencev1.ReleaseResponse{Scope: scope, Token: r.Lease.Token}), nil
}

// Get implements fence.v1.LeaseService.Get.
func (s *Server) Get(ctx context.Context, req *connect.Request[fencev1.GetRequest]) (*connect.Response[fencev1.GetResponse], error) {
	if err := fence.ValidateScope(req.Msg.Scope); err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	// Every grant acknowledged before this call was applied here, and no
	// other leader had been elected when a quorum last answered this one
	// (see raftnode's VerifyLeader for how long ago that can be).
	if err := s.node.VerifyLeader(ctx); err != nil {
		return nil, wire.ToConnect(err)
	}
	var in fsm.ScopeInfo
	s.node.Read(func(st *fsm.State) { in = st.Get(req.Msg.Scope) })
	resp := &fencev1.GetResponse{Scope: in.Scope, LastToken: in.Last, Waiters: uint32(in.Waiters)}
	if in.Lease != nil {
		resp.Lease = s.lease(in.Scope, *in.Lease, false)
	}
	return connect.NewResponse(resp), nil
}

// List implements fence.v1.LeaseService.List.
func (s *Server) List(ctx context.Context, req *connect.Request[fencev1.ListRequest]) (*connect.Response[fencev1.ListResponse], error) {
	m := req.Msg
	if err := fence.ValidatePrefix(m.Prefix); err != nil {
		return nil, wire.ToConnect(err)
	}
	size := int(m.PageSize)
	switch {
	case size == 0:
		size = defaultPageSize
	case size > maxPageSize:
		return nil, wire.ToConnect(&fence.InvalidError{Field: "page_size", Reason: fmt.Sprintf("%d is above the maximum %d", size, maxPageSize)})
	}
	after, err := decodePageToken(m.PageToken)
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := s.node.VerifyLeader(ctx); err != nil {
		return nil, wire.ToConnect(err)
	}
	var held []fsm.ScopeInfo
	s.node.Read(func(st *fsm.State) { held = st.Held(m.Prefix, after, size+1) })
	resp := &fencev1.ListResponse{}
	if len(held) > size {
		held = held[:size]
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(held[size-1].Scope))
	}
	for _, in := range held {
		resp.Leases = append(resp.Leases, s.lease(in.Scope, *in.Lease, false))
	}
	return connect.NewResponse(resp), nil
}

func decodePageToken(t string) (string, error) {
	if t == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(t)
	if err != nil || fence.ValidateScope(string(b)) != nil {
		return "", &fence.InvalidError{Field: "page_token", Reason: "not a next_page_token this service returned"}
	}
	return string(b), nil
}

// ttl applies the default and checks the bounds.
func (s *Server) ttl(d time.Duration, set bool) (time.Duration, error) {
	if !set {
		return s.cfg.DefaultTTL, nil
	}
	if d < s.cfg.MinTTL || d > s.cfg.MaxTTL {
		return 0, &fence.InvalidError{Field: "ttl", Reason: fmt.Sprintf("%v is outside the allowed range %v to %v (--max-ttl)", d, s.cfg.MinTTL, s.cfg.MaxTTL)}
	}
	return d, nil
}

func scopeAndID(scope, leaseID string) (string, fence.LeaseID, error) {
	if err := fence.ValidateScope(scope); err != nil {
		return "", fence.LeaseID{}, err
	}
	id, err := fence.ParseLeaseID(leaseID)
	return scope, id, err
}

// lease converts a state machine lease to the wire, with its time left.
func (s *Server) lease(scope string, l fsm.Lease, withID bool) *fencev1.Lease {
	fl := fence.Lease{
		Scope: scope, Token: l.Token, ID: l.ID, Holder: l.Holder, TTL: l.TTL,
		ExpiresIn: s.lessor.Left(scope, l.Token, time.Now()),
	}
	if withID {
		fl.Signed = s.sign(fence.Token{Scope: scope, Value: l.Token})
	}
	var granted time.Time
	if l.GrantedAt != 0 {
		granted = time.Unix(0, l.GrantedAt)
	}
	return wire.Lease(fl, granted, withID)
}

// outcomeError explains a result that is not the success the caller wanted.
func (s *Server) outcomeError(r fsm.Result) error {
	switch r.Outcome {
	case fsm.Held:
		if errors.Is(r.Err, fsm.ErrLineFull) {
			return fmt.Errorf("%w: scope %q is held by %q with token %d and its line of waiters is full (%d, fenced --max-waiters); retry later",
				fence.ErrHeld, r.Scope, r.Lease.Holder, r.Lease.Token, s.cfg.MaxWaiters)
		}
		return &fence.HeldError{Scope: r.Scope, Holder: r.Lease.Holder, Token: r.Lease.Token,
			ExpiresIn: s.lessor.Left(r.Scope, r.Lease.Token, time.Now())}
	case fsm.Lost:
		reason := "it expired, was released or was superseded"
		if r.Current != 0 && r.Current == r.Lease.Token {
			reason = "its deadline passed and it is being expired"
		}
		return &fence.LostError{Scope: r.Scope, Token: r.Lease.Token, Current: r.Current, Reason: reason}
	case fsm.NotHolder:
		return fmt.Errorf("%w: scope %q has no current or recent lease with that ID (an old lease may have expired long ago)", fence.ErrNotHolder, r.Scope)
	case fsm.Exhausted:
		return fmt.Errorf("%w: scope %q issued token %d, the maximum", fence.ErrTokensExhausted, r.Scope, uint64(fence.MaxToken))
	case fsm.Invalid:
		return r.Err
	}
	return fmt.Errorf("unexpected outcome %v for scope %q", r.Outcome, r.Scope)
}
