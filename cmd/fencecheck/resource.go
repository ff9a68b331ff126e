package main

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the resource's PostgreSQL driver
	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/follow"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/guard/sqlguard"
	"github.com/fence-dev/fence/internal/history"
)

// The resource is an HTTP service holding one register per scope. Scopes
// under "bolt/" live in a bbolt file fenced by boltguard, scopes under
// "pg/" in a PostgreSQL table fenced by sqlguard, scopes under "s3/" in an
// S3 bucket fenced by s3guard (s3.go); httpguard reads the token. Reads are fenced too (a read-modify-write is safe only if the
// read also advances the mark: otherwise a stale write can land between
// the new holder's read and its write). With --no-fence the same handler
// runs without the guard.
//
//	POST /op/{scope}    body {"kind":"read"|"write","value":V}; headers
//	                    Fencing-Token, Fencing-Sequence, Fencecheck-Ref
//	GET  /value/{scope} the register's value, unfenced (for the final read)
//	GET  /log           every applied request, as history events
//	GET  /healthz

// Request and response bodies of POST /op.
type opRequest struct {
	Kind  string `json:"kind"`
	Value string `json:"value,omitempty"`
}

type opResponse struct {
	Index uint64 `json:"index"`
	Value string `json:"value"`
}

// RefHeader carries the operation's ID (PROC.OP) into the resource's log.
const RefHeader = "Fencecheck-Ref"

// application is one request the resource applies.
type application struct {
	scope, kind, value, ref string
	token, seq              uint64
}

// backend is a register store beside the guard's store: apply runs inside
// the transaction of the Fence call whose apply received ctx, if any, so
// the register, its log and the mark commit together.
type backend interface {
	// fences is the guard's store, on the register's database.
	fences() guard.Store
	apply(ctx context.Context, a application) (opResponse, error)
	value(ctx context.Context, scope string) (string, error)
	log(ctx context.Context) ([]history.Event, error)
	close() error
}

func resourceCmd(args []string) error {
	fs := flag.NewFlagSet("fencecheck resource", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	boltPath := fs.String("bolt", "", "bbolt file for the bolt/ scopes")
	dsn := fs.String("postgres", "", "PostgreSQL DSN for the pg/ scopes (none: no pg/ scopes)")
	prefix := fs.String("pg-prefix", "fencecheck", "prefix of the PostgreSQL tables")
	s3URL := fs.String("s3", "", "S3 server and bucket for the s3/ scopes, http://KEY:SECRET@HOST:PORT/BUCKET (none: no s3/ scopes)")
	s3Prefix := fs.String("s3-prefix", "fencecheck/", "prefix of the run's objects in the bucket")
	noFence := fs.Bool("no-fence", false, "apply every request without checking its token")
	followAddrs := fs.String("follow", "", "fenced address(es), comma-separated: advance the marks of the scopes STORE/f... from its watch stream (guard/follow)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	backends := map[string]backend{}
	if *boltPath != "" {
		b, err := openBolt(*boltPath)
		if err != nil {
			return err
		}
		defer b.close()
		backends["bolt"] = b
	}
	if *dsn != "" {
		b, err := openPostgres(ctx, *dsn, *prefix)
		if err != nil {
			return err
		}
		defer b.close()
		backends["pg"] = b
	}
	if *s3URL != "" {
		b, err := openS3(ctx, *s3URL, *s3Prefix, !*noFence)
		if err != nil {
			return err
		}
		defer b.close()
		backends["s3"] = b
	}
	if len(backends) == 0 {
		return usageError{errors.New("resource: give --bolt, --postgres, --s3 or several")}
	}
	mux := http.NewServeMux()
	for name, b := range backends {
		var h http.Handler = opHandler(b, !*noFence)
		if !*noFence {
			g := guard.New(b.fences(), guard.WithStrictSequence(), guard.WithLogger(log))
			// WithRepeats for the bolt/ scopes' Batched store: opHandler
			// changes nothing but the store's transaction.
			fenced, err := httpguard.Middleware(g, "", httpguard.WithRepeats(), httpguard.WithScopeFunc(scopeOf))
			if err != nil {
				return err
			}
			h = fenced(h)
		}
		mux.Handle("POST /op/"+name+"/", h)
		mux.HandleFunc("GET /value/"+name+"/", func(w http.ResponseWriter, r *http.Request) {
			v, err := b.value(r.Context(), strings.TrimPrefix(r.URL.Path, "/value/"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			io.WriteString(w, v)
		})
	}
	if *followAddrs != "" {
		c, err := client.New(*followAddrs, client.WithRetryTimeout(2*time.Second))
		if err != nil {
			return err
		}
		defer c.Close()
		for name, b := range backends {
			f := follow.New(c, markingStore{b}, name+"/f", follow.WithLogger(log))
			go f.Run(ctx)
		}
	}
	mux.HandleFunc("GET /log", func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		for _, b := range backends {
			evs, err := b.log(r.Context())
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			for _, e := range evs {
				enc.Encode(e)
			}
		}
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func scopeOf(r *http.Request) string { return strings.TrimPrefix(r.URL.Path, "/op/") }

// opHandler applies one read or write. Behind the guard it runs inside the
// fenced transaction; without it, it reads the token headers only to log
// them.
func opHandler(b backend, fenced bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req opRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.Kind != history.Read && req.Kind != history.Write {
			http.Error(w, fmt.Sprintf("want a JSON body {\"kind\":\"read\"|\"write\",\"value\":...}: %v", err), http.StatusBadRequest)
			return
		}
		a := application{scope: scopeOf(r), kind: req.Kind, value: req.Value, ref: r.Header.Get(RefHeader)}
		if tok, err := fence.ParseToken(r.Header.Get(httpguard.TokenHeader)); err == nil {
			a.token = tok.Value
		} else if fenced {
			http.Error(w, err.Error(), http.StatusBadRequest) // unreachable behind the middleware
			return
		}
		a.seq, _ = strconv.ParseUint(r.Header.Get(httpguard.SequenceHeader), 10, 64)
		resp, err := b.apply(r.Context(), a)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(resp)
	})
}

// markingStore is a backend's guard store whose every advance logs a mark
// in the resource's log, in the advance's transaction: a follower's marks
// then take their place in the scope's order, where check 1 sees a write
// below one, and the windows are measured to them.
type markingStore struct{ b backend }

func (m markingStore) Fence(ctx context.Context, w guard.Write, strict bool, apply func(context.Context) error) error {
	return m.b.fences().Fence(ctx, w, strict, func(ctx context.Context) error {
		if err := apply(ctx); err != nil {
			return err
		}
		_, err := m.b.apply(ctx, application{scope: w.Token.Scope, kind: history.Mark, ref: "follower", token: w.Token.Value})
		return err
	})
}

// Scopes lists the marked scopes of the backend's store (both are
// guard.Listers), so that a follower restarted with the resource closes the
// leases that ended while it was down.
func (m markingStore) Scopes(ctx context.Context, prefix string) ([]string, error) {
	return m.b.fences().(guard.Lister).Scopes(ctx, prefix)
}

// logEvent is the resource's record of one applied request.
func logEvent(a application, index uint64, value string) history.Event {
	wall, mono := history.Now()
	return history.Event{Type: history.Applied, Proc: "resource", F: a.kind, Scope: a.scope, Token: a.token, Seq: a.seq,
		Index: index, Ref: a.ref, Value: value, Wall: wall, Mono: mono}
}

// boltBackend keeps the registers, their counters and the log in the
// bbolt file where boltguard keeps the marks.
type boltBackend struct{ *boltguard.Store }

var (
	registerBucket = []byte("register")
	appliedBucket  = []byte("applied")
	logBucket      = []byte("log")
)

func openBolt(path string) (*boltBackend, error) {
	s, err := boltguard.Open(path)
	if err != nil {
		return nil, err
	}
	err = s.DB().Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{registerBucket, appliedBucket, logBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	return &boltBackend{s}, nil
}

func (b *boltBackend) apply(ctx context.Context, a application) (opResponse, error) {
	var resp opResponse
	do := func(tx *bbolt.Tx) error {
		key := []byte(a.scope)
		applied := tx.Bucket(appliedBucket)
		var n uint64
		if v := applied.Get(key); len(v) == 8 {
			n = binary.BigEndian.Uint64(v)
		}
		n++
		if err := applied.Put(key, binary.BigEndian.AppendUint64(nil, n)); err != nil {
			return err
		}
		reg := tx.Bucket(registerBucket)
		if a.kind == history.Write {
			if err := reg.Put(key, []byte(a.value)); err != nil {
				return err
			}
		}
		resp = opResponse{Index: n, Value: string(reg.Get(key))}
		e, err := json.Marshal(logEvent(a, n, resp.Value))
		if err != nil {
			return err
		}
		return tx.Bucket(logBucket).Put(binary.BigEndian.AppendUint64(append(key, 0), n), e)
	}
	var err error
	if tx, ok := boltguard.TxFromContext(ctx); ok {
		err = do(tx) // in the transaction that advanced the mark
	} else {
		err = b.DB().Update(do)
	}
	return resp, err
}

// fences is boltguard's Batched store, which commits concurrent requests
// together, as a service with many writers would: a crash of the resource
// must lose a whole batch or none of it.
func (b *boltBackend) fences() guard.Store { return b.Batched() }

func (b *boltBackend) value(_ context.Context, scope string) (string, error) {
	var v string
	err := b.DB().View(func(tx *bbolt.Tx) error {
		v = string(tx.Bucket(registerBucket).Get([]byte(scope)))
		return nil
	})
	return v, err
}

func (b *boltBackend) log(context.Context) ([]history.Event, error) {
	var evs []history.Event
	err := b.DB().View(func(tx *bbolt.Tx) error {
		return tx.Bucket(logBucket).ForEach(func(_, v []byte) error {
			var e history.Event
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			evs = append(evs, e)
			return nil
		})
	})
	return evs, err
}

func (b *boltBackend) close() error { return b.Close() }

// pgBackend keeps the registers and the log in PostgreSQL tables beside
// sqlguard's fence table, all named after the run.
type pgBackend struct {
	*sqlguard.Store
	db     *sql.DB
	prefix string
}

func openPostgres(ctx context.Context, dsn, prefix string) (*pgBackend, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	s, err := sqlguard.New(db, sqlguard.Postgres, sqlguard.WithTable(prefix+"_tokens"))
	if err != nil {
		db.Close()
		return nil, err
	}
	b := &pgBackend{Store: s, db: db, prefix: prefix}
	err = s.CreateTable(ctx)
	for _, stmt := range []string{
		"CREATE TABLE IF NOT EXISTS " + prefix + "_register (scope TEXT PRIMARY KEY, value TEXT NOT NULL, applied BIGINT NOT NULL)",
		"CREATE TABLE IF NOT EXISTS " + prefix + "_log (scope TEXT NOT NULL, idx BIGINT NOT NULL, event TEXT NOT NULL, PRIMARY KEY (scope, idx))",
	} {
		if err == nil {
			_, err = db.ExecContext(ctx, stmt)
		}
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return b, nil
}

func (b *pgBackend) apply(ctx context.Context, a application) (opResponse, error) {
	tx, fenced := sqlguard.TxFromContext(ctx)
	if !fenced {
		var err error
		if tx, err = b.db.BeginTx(ctx, nil); err != nil {
			return opResponse{}, err
		}
		defer tx.Rollback()
	}
	var resp opResponse
	_, err := tx.ExecContext(ctx, "INSERT INTO "+b.prefix+"_register (scope, value, applied) VALUES ($1, '', 0) ON CONFLICT (scope) DO NOTHING", a.scope)
	if err == nil {
		// The update locks the row, so requests of one scope take their
		// index in the order they commit, fenced or not.
		err = tx.QueryRowContext(ctx, "UPDATE "+b.prefix+"_register SET applied = applied + 1, value = CASE WHEN $2 THEN $3 ELSE value END WHERE scope = $1 RETURNING applied, value",
			a.scope, a.kind == history.Write, a.value).Scan(&resp.Index, &resp.Value)
	}
	if err == nil {
		var e []byte
		e, err = json.Marshal(logEvent(a, resp.Index, resp.Value))
		if err == nil {
			_, err = tx.ExecContext(ctx, "INSERT INTO "+b.prefix+"_log (scope, idx, event) VALUES ($1, $2, $3)", a.scope, resp.Index, string(e))
		}
	}
	if err == nil && !fenced {
		err = tx.Commit()
	}
	return resp, err
}

func (b *pgBackend) value(ctx context.Context, scope string) (string, error) {
	var v string
	err := b.db.QueryRowContext(ctx, "SELECT value FROM "+b.prefix+"_register WHERE scope = $1", scope).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

func (b *pgBackend) log(ctx context.Context) ([]history.Event, error) {
	rows, err := b.db.QueryContext(ctx, "SELECT event FROM "+b.prefix+"_log ORDER BY scope, idx")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var evs []history.Event
	for rows.Next() {
		var s string
		var e history.Event
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(s), &e); err != nil {
			return nil, err
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

func (b *pgBackend) fences() guard.Store { return b.Store }

func (b *pgBackend) close() error {
	b.Store.Close()
	return b.db.Close()
}

// dropPostgres removes a run's tables.
func dropPostgres(ctx context.Context, dsn, prefix string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+prefix+"_register, "+prefix+"_log, "+prefix+"_tokens")
	return err
}
