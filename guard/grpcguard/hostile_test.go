package grpcguard_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/grpcguard"
)

// newStoreServer is newServer with the guard's MemoryStore at hand, to
// read the mark.
func newStoreServer(t testing.TB) (string, *register, *guard.MemoryStore) {
	t.Helper()
	reg := &register{value: map[string]string{}, log: map[string][]uint64{}}
	store := guard.NewMemoryStore()
	g := guard.New(store, guard.WithLogger(slog.New(slog.DiscardHandler)))
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(mustUnary(t, g, scopeOf)),
		grpc.ChainStreamInterceptor(mustStream(t, g, scopeOf)),
	)
	testgrpc.RegisterTestServiceServer(srv, reg)
	return serve(t, srv), reg, store
}

// TestHostileMetadata presents hostile fencing-token and fencing-sequence
// metadata to unary and streaming calls. Each malformed or foreign one is
// InvalidArgument naming what is wrong, the handler does not run and the
// mark does not move; tokens beyond float64's exact integers are ordered
// exactly.
func TestHostileMetadata(t *testing.T) {
	tok := func(v string) []string { return []string{grpcguard.TokenKey, "fence:v1:orders:" + v} }
	cases := []struct {
		name string
		md   []string
		says string
	}{
		{"no token", nil, "missing fencing-token metadata"},
		{"binary key only", []string{grpcguard.TokenKey + "-bin", "fence:v1:orders:9"}, "missing fencing-token metadata"},
		{"empty token", []string{grpcguard.TokenKey, ""}, `must start with "fence:"`},
		{"token 0", tok("0"), "from 1 to 9223372036854775807"},
		{"negative token", tok("-9"), "from 1 to 9223372036854775807"},
		{"token 1e309", tok("1e309"), "not a decimal integer"},
		{"leading zeros", tok("009"), "without leading zeros"},
		{"a plus sign", tok("+9"), "not a decimal integer"},
		{"token 2^63", tok("9223372036854775808"), "above the maximum"},
		{"token 2^64", tok("18446744073709551616"), "above the maximum"},
		{"another scope", []string{grpcguard.TokenKey, "fence:v1:billing:9"}, "another scope"},
		{"a ../ scope", []string{grpcguard.TokenKey, "fence:v1:orders/../billing:9"}, `".." segment`},
		{"two tokens", append(tok("9"), tok("10")...), "2 fencing-token metadata values"},
		{"sequence 0", append(tok("9"), grpcguard.SequenceKey, "0"), "from 1 to 18446744073709551615"},
		{"negative sequence", append(tok("9"), grpcguard.SequenceKey, "-1"), "from 1 to 18446744073709551615"},
		{"sequence 2^64", append(tok("9"), grpcguard.SequenceKey, "18446744073709551616"), "from 1 to 18446744073709551615"},
		{"sequence 1e3", append(tok("9"), grpcguard.SequenceKey, "1e3"), "from 1 to 18446744073709551615"},
		{"two sequences", append(tok("9"), grpcguard.SequenceKey, "9", grpcguard.SequenceKey, "1"), "want one decimal integer"},
	}
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			addr, reg, store := newStoreServer(t)
			c := dial(t, addr)
			ctx := metadata.AppendToOutgoingContext(context.Background(), append(tok("5"), grpcguard.SequenceKey, "3")...)
			if err := w.write(ctx, c, "five"); err != nil {
				t.Fatal(err)
			}
			for _, tc := range cases {
				before, calls := store.Highest("orders"), reg.calls.Load()
				err := w.write(metadata.AppendToOutgoingContext(context.Background(), tc.md...), c, "X")
				if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.says) {
					t.Errorf("%s: %v, want InvalidArgument saying %q", tc.name, err, tc.says)
				}
				if reg.calls.Load() != calls {
					t.Errorf("%s: the handler ran", tc.name)
				}
				if after := store.Highest("orders"); after != before {
					t.Errorf("%s: the mark moved from %+v to %+v", tc.name, before, after)
				}
			}
			for _, p := range []struct{ newer, older uint64 }{{1<<53 + 1, 1 << 53}, {fence.MaxToken, fence.MaxToken - 1}} {
				if err := w.write(withToken("orders", p.newer), c, "new"); err != nil {
					t.Fatalf("token %d: %v", p.newer, err)
				}
				err := w.write(withToken("orders", p.older), c, "old")
				if stale, ok := grpcguard.FromError(err); !ok || stale.Presented != p.older || stale.Highest != p.newer {
					t.Errorf("token %d after %d: %v; want stale naming both exactly", p.older, p.newer, err)
				}
				if m := store.Highest("orders"); m.Token != p.newer {
					t.Errorf("mark %d, want %d", m.Token, p.newer)
				}
			}
			if got := reg.get("orders"); got != "new" {
				t.Errorf("stored %q, want the last accepted write", got)
			}
		})
	}
}
