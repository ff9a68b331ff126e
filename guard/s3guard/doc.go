// Package s3guard fences writes to an S3-compatible bucket. S3's
// conditional writes compare for equality (If-Match on an ETag,
// If-None-Match: *), not for "token ≥ mark", so the guard builds the rule
// on one compare-and-swap: each scope has a mark object holding its
// highest token and sequence and naming the scope's objects, and every
// write commits by swapping that mark, conditional on the version it
// checked. A write's data goes first to a new key of its own, which no
// reader sees until the mark names it; so a write refused, or beaten by a
// newer holder between its check and its swap, changes nothing a reader
// sees. The rule, the errors and the sequence numbers are guard.Check's,
// as in every other guard.
//
// # Usage
//
// Make one Guard per bucket and write a scope's objects with the lease's
// token:
//
//	g := s3guard.New(api, "my-bucket") // api: an *s3.Client
//	w := guard.Write{Token: lease.Token()}
//	err := g.Put(ctx, w, "manifest.json", data)
//	if errors.Is(err, fence.ErrStale) {
//		// the lease is lost: stop, do not retry with this token
//	}
//	data, err = g.Get(ctx, "tables/orders", "manifest.json")
//
// Put writes an object, Delete removes one, Get and Names read through
// the mark. For data too large for one request, upload it (a multipart
// upload, say) to a key from NewKey and then Commit it under a name. A
// stale write returns a *guard.StaleError (errors.Is fence.ErrStale) with
// the scope, the presented and the highest token and sequence; the Guard
// logs it with slog and reports it to an optional guard.Observer.
// WithVerifier checks the tokens' signatures before any request.
//
// Store is the same mark objects as a guard.Store and a guard.Lister: for
// guard/follow (fencectl guard follow s3://BUCKET/PREFIX), which advances
// the marks at each grant and each end of a lease so that an ended
// lease's late write is refused before anyone else writes.
//
// # Objects
//
// Under DefaultPrefix "fence/" (see WithPrefix), scope S has the mark
// object "fence/marks/" + E(S), where E writes every byte other than ASCII
// letters, digits, '-' and '_' as '%' and two upper-case hex digits
// ("orders/eu" → "fence/marks/orders%2Feu"). Its body is JSON:
//
//	{"token":"42","seq":"3","commit":"<32 hex digits>","objects":{"manifest.json":"fence/data/orders%2Feu/42-3-<32 hex digits>"}}
//
// token and seq are decimal strings (64-bit integers, exact in any JSON
// reader); commit is random per write, so that every version of the mark,
// and so its ETag, is new, and a writer whose request was retried after it
// landed knows its own write; objects maps each name to
// the key of its data, always under "fence/data/" + E(S) + "/". A write is
// a GET of the mark (with its ETag), guard.Check, a PUT of the data to a
// fresh key, and a PUT of the new mark with If-Match: ETAG (If-None-Match:
// * for a scope without a mark). A 412 or 409 answer means another writer
// swapped first: read the mark again, and if the write is now stale, it is
// refused (its data deleted); otherwise swap again. After the swap, the
// data the write replaced is deleted. docs/protocol.md spells this out for
// writers in other languages.
//
// # Caveats
//
// Every reader must go through the mark (Get, or the same two GETs in
// another language): the data keys are an implementation detail, and a
// key read directly may be a refused write's or a replaced one's. A reader
// whose data key has just been deleted by a newer write reads the mark
// again.
//
// Writers must not bypass the guard: a plain PUT to a key the mark names,
// or to the mark object, is not fenced. Let only the guard's writers
// write under the prefix (an IAM or bucket policy; docs/protocol.md has
// one that also requires every PUT of a mark to be conditional).
//
// A write costs three requests (four when it replaces an object, whose
// old data it deletes), and a read two. All writes of a scope are ordered
// by its one mark object: writes of one scope are serial, one per four
// request times or so, and many scopes write in parallel. Measured
// (BenchmarkPut, SeaweedFS on loopback, a busy 2-core machine), a 4 KiB
// put took 8 to 15 ms through the guard and 2.5 to 5 ms plain, about 3
// times as long, so one scope took 70 to 130 writes a second; against S3
// over a network, where a request takes tens of milliseconds, expect
// about ten a second per scope (an estimate, not measured here). The
// mark lists the scope's objects and is rewritten by each write, so keep
// a scope to a few thousand objects.
//
// A write that fails with an error other than a *guard.StaleError may or
// may not have landed: when the swap's answer is lost, the Guard reads the
// mark and reports the write done if the mark is its own, but a swap still
// in flight may land after that read. Read (Get, Highest) before writing
// again.
//
// Store's Fence cannot undo an apply that another process's newer write
// overtook; it reports it afterwards (ErrSuperseded). Give it only applies
// whose effects nobody sees until the mark names them, or none (a
// follower's); write data with Guard.
//
// The server must honour If-Match and If-None-Match on PutObject: AWS S3
// (since 2024), MinIO, Cloudflare R2, Ceph RGW and SeaweedFS do. On one
// that ignores them, two writers can both win a swap, and the guard fences
// nothing; the tests run against SeaweedFS, which make services builds.
package s3guard
