package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // postgres-row's database/sql driver
	"github.com/redis/go-redis/v9"
	"go.etcd.io/bbolt"
	_ "modernc.org/sqlite"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/guard/pgxguard"
	"github.com/fence-dev/fence/guard/redisguard"
	"github.com/fence-dev/fence/guard/sqlguard"
	"github.com/fence-dev/fence/signing"
)

// The stores of the guarded-write workloads, as named after
// "guarded-write-" in their workload.
const (
	storeBolt     = "bbolt"
	storeSQLite   = "sqlite"
	storePostgres = "postgres"
	// storePostgresRow is PostgreSQL with the token in the written row
	// (sqlguard's UpdateRow) rather than in a fence table.
	storePostgresRow = "postgres-row"
	storeRedis       = "redis"
	// storeS3 is an S3-compatible bucket (make services' SeaweedFS).
	storeS3 = "s3"
)

// The guarded write's tables and keys. Each cell drops and makes its
// PostgreSQL tables again, and deletes its Redis keys when it ends: those
// servers are shared with other runs.
const (
	dataTable   = "bench_peers_data"
	rowTable    = "bench_peers_rows"
	fenceTable  = "bench_peers_fences"
	redisPrefix = "bench-peers:"
)

var dataBucket = []byte("data")

// resourceMain runs the resource of a guarded-write workload: an HTTP
// service whose POST /write/SCOPE stores the request body under SCOPE in
// one store (-store), durably as that store commits, with or without the
// guard (-guard). The guarded one refuses a stale token and verifies each
// token's signature with the public keys fenced serves (-keys), as a
// resource given the service's keys runs it:
//
//   - bbolt: the write is a Put in a bbolt transaction (fsync on), and
//     concurrent writes share a commit: DB.Batch when plain, boltguard's
//     Batched store under httpguard when guarded (its mark checked and
//     advanced in the same transaction).
//   - sqlite: an upsert in a transaction (modernc.org/sqlite, WAL,
//     synchronous FULL, one connection: SQLite has one writer), plain or
//     under httpguard over sqlguard's Store (the fence table's
//     conditional upsert in the same transaction).
//   - postgres: an upsert in a transaction through pgx, plain
//     (pgx.BeginFunc) or under httpguard over pgxguard's Store (BEGIN and
//     the fence statement in one round trip, then the same upsert).
//   - postgres-row: an UPDATE of the scope's row in a transaction through
//     database/sql and pgx's driver, the row inserted first if missing;
//     plain, or through sqlguard's UpdateRow, whose condition on the row's
//     own token column rides in the same UPDATE (no fence table). Not
//     httpguard: UpdateRow fences one named row, which the handler names.
//   - redis: a SET, plain, or redisguard.Guard's Set (one script: check
//     the mark, SET, advance the mark), the token read from the request
//     header. Not httpguard: its Redis store checks and records the mark in
//     two more round trips around the handler, and redisguard's docs send
//     Redis data to Guard.
//   - s3: a PutObject of the body to the scope's key in a bucket (-s3),
//     plain, or s3guard.Guard's Put (the scope's mark read, the body put to
//     a key of its own, the mark swapped with If-Match to name it, the data
//     it replaced deleted: four requests instead of one), the token read
//     from the request header. Not httpguard, for Redis's reason: s3guard's
//     docs send bucket data to Guard. Durable as the server makes a PUT.
func resourceMain(args []string) error {
	fs := flag.NewFlagSet(roleResource, flag.ContinueOnError)
	dir := fs.String("dir", "", "data directory")
	listen := fs.String("listen", "127.0.0.1:0", "HTTP address")
	store := fs.String("store", storeBolt, "bbolt, sqlite, postgres, postgres-row, redis or s3")
	guarded := fs.Bool("guard", true, "fence the writes")
	keysFrom := fs.String("keys", "", "fenced address whose public keys verify the tokens")
	pgDSN := fs.String("postgres", "", "PostgreSQL DSN")
	redisURL := fs.String("redis", "", "Redis URL")
	s3URL := fs.String("s3", "", "S3 server and bucket, http://KEY:SECRET@HOST:PORT/BUCKET")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// PEERS_RESOURCE_PROFILE names a file for the resource's CPU profile,
	// written when it stops: where a guarded write's time goes.
	if path := os.Getenv("PEERS_RESOURCE_PROFILE"); path != "" {
		f, err := os.Create(fmt.Sprintf("%s.%s-%t", path, *store, *guarded))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var keys *signing.KeySet
	if *guarded {
		if *keysFrom == "" {
			return errors.New("a guarded resource needs -keys")
		}
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		keys, err = signing.Fetch(fctx, nil, *keysFrom)
		cancel()
		if err != nil {
			return err
		}
	}
	h, closeStore, err := resourceHandler(ctx, *store, keys, *dir, sharedServers{postgres: *pgDSN, redis: *redisURL, s3: *s3URL})
	if err != nil {
		return fmt.Errorf("%s: %w", *store, err)
	}
	defer closeStore()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: routes(h), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Println(readyLine)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// routes serves write at POST /write/SCOPE.
func routes(write http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /write/{scope...}", write)
	return mux
}

// sharedServers are the shared servers' addresses a store may need.
type sharedServers struct {
	postgres, redis, s3 string
}

// resourceHandler returns the write handler of one store, guarded by
// tokens that keys verify or, with keys nil, not guarded, and a func that
// closes the store.
func resourceHandler(ctx context.Context, store string, keys *signing.KeySet, dir string, srv sharedServers) (http.Handler, func(), error) {
	pgDSN, redisURL := srv.postgres, srv.redis
	guarded := keys != nil
	// The guard's scope is the path's: each worker writes its own.
	scopeOf := httpguard.WithScopeFunc(func(r *http.Request) string { return r.PathValue("scope") })
	fenced := func(s guard.Store, h http.HandlerFunc, opts ...httpguard.Option) (http.Handler, error) {
		mw, err := httpguard.Middleware(guard.New(s, guard.WithVerifier(keys)), "", append(opts, scopeOf)...)
		if err != nil {
			return nil, err
		}
		return mw(h), nil
	}
	switch store {
	case storeBolt:
		s, err := boltguard.Open(filepath.Join(dir, "resource.db"))
		if err != nil {
			return nil, nil, err
		}
		if err := s.DB().Update(func(tx *bbolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists(dataBucket)
			return err
		}); err != nil {
			s.Close()
			return nil, nil, err
		}
		put := func(tx *bbolt.Tx, r *http.Request, body []byte) error {
			return tx.Bucket(dataBucket).Put([]byte(r.PathValue("scope")), body)
		}
		closer := func() { s.Close() }
		if !guarded {
			return write(func(r *http.Request, body []byte) error {
				return s.DB().Batch(func(tx *bbolt.Tx) error { return put(tx, r, body) })
			}), closer, nil
		}
		// The handler only writes in the store's transaction, so it may run
		// again when bbolt retries a batch.
		h, err := fenced(s.Batched(), write(func(r *http.Request, body []byte) error {
			tx, ok := boltguard.TxFromContext(r.Context())
			if !ok {
				return errors.New("no transaction")
			}
			return put(tx, r, body)
		}), httpguard.WithRepeats())
		if err != nil {
			closer()
			return nil, nil, err
		}
		return h, closer, nil

	case storeSQLite:
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "resource.sqlite")+
			"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)")
		if err != nil {
			return nil, nil, err
		}
		db.SetMaxOpenConns(1)
		closer := func() { db.Close() }
		upsert := "INSERT INTO " + dataTable + " (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
		if _, err := db.ExecContext(ctx, "CREATE TABLE "+dataTable+" (k TEXT PRIMARY KEY, v BLOB NOT NULL)"); err != nil {
			closer()
			return nil, nil, err
		}
		if !guarded {
			return write(func(r *http.Request, body []byte) error {
				return inTx(r.Context(), db, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(r.Context(), upsert, r.PathValue("scope"), body)
					return err
				})
			}), closer, nil
		}
		s, err := sqlguard.New(db, sqlguard.SQLite)
		if err == nil {
			err = s.CreateTable(ctx)
		}
		if err != nil {
			closer()
			return nil, nil, err
		}
		h, err := fenced(s, write(func(r *http.Request, body []byte) error {
			tx, ok := sqlguard.TxFromContext(r.Context())
			if !ok {
				return errors.New("no transaction")
			}
			_, err := tx.ExecContext(r.Context(), upsert, r.PathValue("scope"), body)
			return err
		}))
		if err != nil {
			closer()
			return nil, nil, err
		}
		return h, closer, nil

	case storePostgres:
		pool, err := pgxpool.New(ctx, pgDSN)
		if err != nil {
			return nil, nil, err
		}
		closer := pool.Close
		for _, q := range []string{
			"DROP TABLE IF EXISTS " + dataTable, "DROP TABLE IF EXISTS " + fenceTable,
			"CREATE TABLE " + dataTable + " (k TEXT PRIMARY KEY, v BYTEA NOT NULL)",
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				closer()
				return nil, nil, err
			}
		}
		upsert := "INSERT INTO " + dataTable + " (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
		if !guarded {
			return write(func(r *http.Request, body []byte) error {
				return pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(r.Context(), upsert, r.PathValue("scope"), body)
					return err
				})
			}), closer, nil
		}
		s, err := pgxguard.New(pool, fenceTable)
		if err == nil {
			err = s.CreateTable(ctx)
		}
		if err != nil {
			closer()
			return nil, nil, err
		}
		h, err := fenced(s, write(func(r *http.Request, body []byte) error {
			tx, ok := pgxguard.TxFromContext(r.Context())
			if !ok {
				return errors.New("no transaction")
			}
			_, err := tx.Exec(r.Context(), upsert, r.PathValue("scope"), body)
			return err
		}))
		if err != nil {
			closer()
			return nil, nil, err
		}
		return h, closer, nil

	case storePostgresRow:
		return rowHandler(ctx, keys, pgDSN)

	case storeRedis:
		ro, err := redis.ParseURL(redisURL)
		if err != nil {
			return nil, nil, err
		}
		ro.PoolSize, ro.MinIdleConns = 128, 64
		rdb := redis.NewClient(ro)
		g := redisguard.New(rdb, redisguard.WithPrefix(redisPrefix), redisguard.WithVerifier(keys))
		// The scopes this resource wrote, to leave the shared Redis as it was
		// found.
		var written sync.Map
		closer := func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			written.Range(func(k, _ any) bool {
				scope := k.(string)
				rdb.Del(cctx, redisguard.Key(scope, "data"), g.MarkKey(scope))
				return true
			})
			rdb.Close()
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			closer()
			return nil, nil, err
		}
		// The scope's hash tag in the key, as redisguard wants it.
		key := func(r *http.Request) string {
			scope := r.PathValue("scope")
			written.Store(scope, true)
			return redisguard.Key(scope, "data")
		}
		if !guarded {
			return write(func(r *http.Request, body []byte) error {
				return rdb.Set(r.Context(), key(r), body, 0).Err()
			}), closer, nil
		}
		return write(func(r *http.Request, body []byte) error {
			tok, err := fence.ParseToken(r.Header.Get(httpguard.TokenHeader))
			if err != nil {
				return badRequest{err}
			}
			return g.Set(r.Context(), guard.Write{Token: tok}, key(r), body, 0)
		}), closer, nil

	case storeS3:
		return s3Handler(ctx, keys, srv.s3)
	}
	return nil, nil, fmt.Errorf("no store %q", store)
}

// rowHandler is the postgres-row store's write handler: each scope's
// value in a row of its own, which carries the token of its last write
// when guarded.
func rowHandler(ctx context.Context, keys *signing.KeySet, pgDSN string) (http.Handler, func(), error) {
	db, err := sql.Open("pgx", pgDSN)
	if err != nil {
		return nil, nil, err
	}
	// As many connections as pgxpool gives the postgres store here.
	db.SetMaxOpenConns(max(4, runtime.NumCPU()))
	db.SetMaxIdleConns(max(4, runtime.NumCPU()))
	closer := func() { db.Close() }
	for _, q := range []string{
		"DROP TABLE IF EXISTS " + rowTable,
		"CREATE TABLE " + rowTable + " (k TEXT PRIMARY KEY, v BYTEA NOT NULL, " + sqlguard.DefaultTokenColumn + " BIGINT NOT NULL DEFAULT 0)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			closer()
			return nil, nil, err
		}
	}
	var s *sqlguard.Store
	if keys != nil {
		if s, err = sqlguard.New(db, sqlguard.Postgres, sqlguard.WithVerifier(keys)); err != nil {
			closer()
			return nil, nil, err
		}
	}
	update := "UPDATE " + rowTable + " SET v = $1 WHERE k = $2"
	insert := "INSERT INTO " + rowTable + " (k, v) VALUES ($1, '') ON CONFLICT (k) DO NOTHING"
	return write(func(r *http.Request, body []byte) error {
		ctx, scope := r.Context(), r.PathValue("scope")
		// put writes the scope's row, and returns sqlguard.ErrNoRow if it
		// has none yet.
		put := func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, update, body, scope)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n == 1 {
				return err
			}
			return sqlguard.ErrNoRow
		}
		if s != nil {
			tok, err := fence.ParseToken(r.Header.Get(httpguard.TokenHeader))
			if err != nil {
				return badRequest{err}
			}
			row := sqlguard.Row{Table: rowTable, Key: "k", ID: scope}
			put = func(tx *sql.Tx) error {
				return s.UpdateRow(ctx, tx, scope, guard.Write{Token: tok}, row, map[string]any{"v": body})
			}
		}
		// A scope's first write finds no row: it is inserted with no token
		// (0), and the write is made again.
		return inTx(ctx, db, func(tx *sql.Tx) error {
			err := put(tx)
			if errors.Is(err, sqlguard.ErrNoRow) {
				if _, err = tx.ExecContext(ctx, insert, scope); err == nil {
					err = put(tx)
				}
			}
			return err
		})
	}), closer, nil
}

// inTx runs fn in a transaction of db and commits it, or rolls it back if
// fn fails.
func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// badRequest is a write refused for what the request carried.
type badRequest struct{ error }

// write returns the handler that stores the request body with store:
// 204 when it did, 409 for a stale token, 400 for a bad one.
func write(store func(r *http.Request, body []byte) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		err = store(r, body)
		var stale *guard.StaleError
		var bad badRequest
		switch {
		case err == nil:
			w.WriteHeader(http.StatusNoContent)
		case errors.As(err, &stale):
			http.Error(w, err.Error(), http.StatusConflict)
		case errors.As(err, &bad), errors.Is(err, fence.ErrInvalid):
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}
}
