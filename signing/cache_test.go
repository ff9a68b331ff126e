package signing

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

// signed returns a token of scope and value signed by k.
func signed(k PrivateKey, scope string, value uint64) fence.Token {
	return k.Sign(fence.Token{Scope: scope, Value: value})
}

// TestCachedTokenForgedSignature: once the genuine token has verified
// (and is cached), the same scope, value and key ID with other signature
// bytes still fails, and so does the same signature on the other form.
func TestCachedTokenForgedSignature(t *testing.T) {
	k := NewKey(time.Now())
	set := NewKeySet(k.Public())
	good := signed(k, "orders", 7)
	for range 2 {
		if err := set.Verify(good); err != nil {
			t.Fatalf("genuine token: %v", err)
		}
	}
	if set.verified.len() != 1 {
		t.Fatalf("cache holds %d tokens after a verification, want 1", set.verified.len())
	}
	forged := good
	b := []byte(forged.Sig)
	b[len(b)-1] ^= 0x40
	forged.Sig = string(b)
	other := NewKey(time.Now())
	other.ID = k.ID
	for name, tok := range map[string]fence.Token{
		"flipped bit":            forged,
		"signed by another key":  other.Sign(good),
		"higher value, same sig": func() fence.Token { t := good; t.Value = fence.MaxToken; return t }(),
		"v2 with the v3 sig":     func() fence.Token { t := SignV2(k, "orders", 7, fence.NewLeaseID()); t.Sig = good.Sig; return t }(),
	} {
		if err := set.Verify(tok); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s after the genuine token was cached: Verify = %v, want ErrBadSignature", name, err)
		}
	}
	if err := set.Verify(good); err != nil {
		t.Errorf("genuine token again: %v", err)
	}
}

// TestCachedTokenKeyGone: a cached token fails once its key is removed by
// Replace, is past NotAfter, or its key ID names another public key.
func TestCachedTokenKeyGone(t *testing.T) {
	k, next := NewKey(time.Now()), NewKey(time.Now())
	tok := signed(k, "orders", 1)
	now := time.Now()

	set := NewKeySet(k.Public(), next.Public())
	if err := set.Verify(tok); err != nil {
		t.Fatal(err)
	}
	set.Replace([]PublicKey{next.Public()})
	if err := set.Verify(tok); !errors.Is(err, ErrBadSignature) {
		t.Errorf("key removed by Replace: Verify = %v, want ErrBadSignature", err)
	}

	pub := k.Public()
	pub.NotAfter = now.Add(time.Minute)
	set = NewKeySet(pub)
	set.now = func() time.Time { return now }
	if err := set.Verify(tok); err != nil {
		t.Fatalf("key in its grace period: %v", err)
	}
	now = now.Add(2 * time.Minute)
	if err := set.Verify(tok); !errors.Is(err, ErrBadSignature) {
		t.Errorf("key retired since the token was cached: Verify = %v, want ErrBadSignature", err)
	}

	set = NewKeySet(k.Public())
	if err := set.Verify(tok); err != nil {
		t.Fatal(err)
	}
	impostor := next.Public()
	impostor.ID = k.ID
	set.Replace([]PublicKey{impostor})
	if err := set.Verify(tok); !errors.Is(err, ErrBadSignature) {
		t.Errorf("key ID now names another key: Verify = %v, want ErrBadSignature", err)
	}
}

// TestCacheBound: however many tokens verify, the cache holds at most
// verifiedCap, and a token in use stays in it.
func TestCacheBound(t *testing.T) {
	k := NewKey(time.Now())
	set := NewKeySet(k.Public())
	hot := signed(k, "hot", 1)
	for i := range 3 * verifiedCap {
		if err := set.Verify(signed(k, fmt.Sprint("s", i), 1)); err != nil {
			t.Fatal(err)
		}
		if i > 0 && !set.verified.has(hot, k.Public().Key) {
			t.Fatalf("after %d tokens, the token verified on every call fell out of the cache", i+2)
		}
		if err := set.Verify(hot); err != nil {
			t.Fatal(err)
		}
		if n := set.verified.len(); n > verifiedCap {
			t.Fatalf("after %d tokens the cache holds %d, more than %d", i+2, n, verifiedCap)
		}
	}
}

// BenchmarkVerify compares a token verified every time (a new one each
// call) with the same token verified again, as a guard sees it on every
// write of one lease.
func BenchmarkVerify(b *testing.B) {
	k := NewKey(time.Now())
	set := NewKeySet(k.Public())
	b.Run("uncached", func(b *testing.B) {
		toks := make([]fence.Token, verifiedCap)
		for i := range toks {
			toks[i] = signed(k, fmt.Sprint("s", i), 1)
		}
		b.ResetTimer()
		for i := range b.N {
			// A fresh cache each call would cost an allocation the real
			// miss does not pay; clearing the entry is what makes it miss.
			t := toks[i%len(toks)]
			set.verified.mu.Lock()
			delete(set.verified.cur, keyOf(t))
			delete(set.verified.old, keyOf(t))
			set.verified.mu.Unlock()
			if err := set.Verify(t); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		t := signed(k, "orders", 1)
		if err := set.Verify(t); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if err := set.Verify(t); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached-parallel", func(b *testing.B) {
		t := signed(k, "orders", 2)
		if err := set.Verify(t); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := set.Verify(t); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
