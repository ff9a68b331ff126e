package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/follow"
	"github.com/fence-dev/fence/guard/guardmetrics"
	"github.com/fence-dev/fence/guard/redisguard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// guardFollowJSON is a line of guard follow's -o json output: one when it
// starts, one per --report interval, and one when it stops.
type guardFollowJSON struct {
	URL      string `json:"url"` // without its password
	Prefix   string `json:"prefix"`
	Advanced uint64 `json:"advanced,string"` // 64-bit integers are strings, as in the API's JSON
	Resyncs  uint64 `json:"resyncs,string"`
	Lag      string `json:"lag"` // a duration as protojson writes one: "0.012s"
	// Listen is where --listen serves /metrics and the status page (the
	// address it bound: a port of 0 is chosen).
	Listen  string `json:"listen,omitempty"`
	Stopped bool   `json:"stopped,omitempty"`
}

func (a *app) newGuardFollowCmd() *cobra.Command {
	var (
		prefix string
		report time.Duration
		listen string
	)
	cmd := &cobra.Command{
		Use:   "follow URL",
		Short: "Advance the in-database guard's marks at each grant and each end of a lease, live",
		Long: `Follow watches the service for the scopes starting with --prefix and moves
the marks of the guard installed at URL (fencectl guard install) at each
grant, and at each release or expiry to the lease's closing token, the
token value the service consumed and granted to nobody when the lease
ended (log format 8). The ended lease's late writes are then refused at
the database before anyone else writes there, instead of at the next
holder's first write; writers need no change, in any language.

It uses the guard's own monotonic advance (the mark only moves up), so it
never moves a mark back and never races a writer. Cut off from the
service, it resumes where it was; when the service no longer holds those
events (a new leader), it reads the state of the leases it saw begin and
not end. A follower that is behind or stopped costs only that window,
never safety.

URL is as for install (postgres://, mysql://, redis://; the table
fence_tokens or the keys fence:{SCOPE}), or s3://BUCKET[/PREFIX] for the
mark objects guard/s3guard keeps in a bucket under PREFIX (fence/ when
omitted), with the credentials of AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
and AWS_SESSION_TOKEN, the region of AWS_REGION (us-east-1 without it),
and, for an S3-compatible server, its address in AWS_ENDPOINT_URL_S3 or
AWS_ENDPOINT_URL (requests then go path-style). It runs until interrupted, and
prints how many marks it advanced and how far behind it is (lag: the age
of the oldest grant or closing received and not yet recorded, or the time
since it lost or has not yet got the watch) every --report, and when it
stops.

With --listen ADDR it serves, as fenced does on its --listen, Prometheus
metrics at /metrics, labelled by the prefix:

  fence_follow_lag_seconds            gauge, the lag above
  fence_follow_marks_advanced_total   counter, marks advanced in the database
  fence_follow_resyncs_total          counter, reads of the state instead of resuming
  fence_follow_watch_position         gauge, the watch stream's position it has
                                      every event up to (0: not watching)

and a plain-text status page at / with the prefix, the service's and the
database's addresses, the lag, the counts and the last error. The first
line printed names the address bound (a port of 0 picks one).`,
		Example: `  fencectl guard follow 'postgres://app:secret@db.internal:5432/shop' --prefix orders/
  fencectl guard follow redis://127.0.0.1:6379 --prefix jobs/ --report 10s -o json
  AWS_ENDPOINT_URL_S3=http://127.0.0.1:8333 fencectl guard follow s3://my-bucket --prefix tables/
  fencectl guard follow mysql://app:secret@db:3306/shop --prefix orders/ --listen 127.0.0.1:9481`,
		Args: exactArgs("URL"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			if err := fence.ValidatePrefix(prefix); err != nil {
				return usage(err)
			}
			if report <= 0 {
				return usageErrorf("--report %v: want a positive duration", report)
			}
			t, err := parseFollowTarget(args[0])
			if err != nil {
				return usage(err)
			}
			ctx := cmd.Context()
			store, closeStore, err := openGuardStore(ctx, t, args[0])
			if err != nil {
				return redactedError{fmt.Errorf("open the guard in %s: %w", redactURL(t.url), err), secrets(t.url)}
			}
			defer closeStore()
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			log := slog.New(slog.NewTextHandler(redactingWriter{a.stderr, secrets(t.url)}, &slog.HandlerOptions{Level: slog.LevelWarn}))
			f := follow.New(c, store, prefix, follow.WithLogger(log))
			var bound string
			if listen != "" {
				ln, err := net.Listen("tcp", listen)
				if err != nil {
					return fmt.Errorf("--listen: %w", err)
				}
				srv, err := followServer(f, a.addr, redactURL(t.url), secrets(t.url))
				if err != nil {
					ln.Close()
					return err
				}
				bound = ln.Addr().String()
				go func() {
					if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
						log.Warn("guard follow: --listen stopped serving", "addr", bound, "err", err)
					}
				}()
				defer srv.Close()
			}
			line := func(stopped bool) error {
				out := guardFollowJSON{URL: redactURL(t.url), Prefix: prefix, Advanced: f.Advanced(), Resyncs: f.Resyncs(),
					Lag: durationJSON(f.Lag()), Listen: bound, Stopped: stopped}
				return a.emit(out, func(w io.Writer) {
					verb := "following"
					if stopped {
						verb = "stopped following"
					}
					fmt.Fprintf(w, "%s %q into %s: %d marks advanced, %d resyncs, lag %s", verb, prefix, out.URL, out.Advanced, out.Resyncs, f.Lag().Round(time.Microsecond))
					if bound != "" && !stopped {
						fmt.Fprintf(w, "; metrics at http://%s/metrics, status at http://%s/", bound, bound)
					}
					fmt.Fprintln(w)
				})
			}
			if err := line(false); err != nil {
				return err
			}
			done := make(chan error, 1)
			go func() { done <- f.Run(ctx) }()
			tick := time.NewTicker(report)
			defer tick.Stop()
			for {
				select {
				case err := <-done:
					if ctx.Err() != nil && errors.Is(err, context.Canceled) {
						return line(true) // interrupted: the normal way to stop
					}
					return err
				case <-tick.C:
					if err := line(false); err != nil {
						return err
					}
				}
			}
		}),
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "follow the scopes starting with this prefix (all without it)")
	cmd.Flags().DurationVar(&report, "report", time.Minute, "print the marks advanced and the lag this often")
	cmd.Flags().StringVar(&listen, "listen", "", "serve Prometheus metrics at /metrics and a status page at / on this host:port (none without it)")
	return cmd
}

// followServer serves f's metrics at /metrics and its status, in plain
// text, at /. service and store name where it follows from and into;
// secrets are blanked out of the errors it shows.
func followServer(f *follow.Follower, service, store string, secrets []string) (*http.Server, error) {
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{
		guardmetrics.NewFollowerCollector(f),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	started := time.Now()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		state := "following"
		pos := f.Position()
		if pos == 0 {
			state = "NOT following: the service has not taken the watch (see the last error)"
		}
		lastErr := "none"
		if at, err := f.LastError(); err != nil {
			lastErr = fmt.Sprintf("%s (%s ago): %s", at.UTC().Format(time.RFC3339), dur(time.Since(at)), redactedError{err, secrets}.Error())
		}
		fmt.Fprintf(w, "fencectl guard follow\n\n"+
			"prefix          %q\n"+
			"service         %s\n"+
			"store           %s\n"+
			"state           %s\n"+
			"lag             %s\n"+
			"marks advanced  %d\n"+
			"resyncs         %d\n"+
			"watch position  %d\n"+
			"last error      %s\n"+
			"up              %s\n",
			f.Prefix(), service, store, state, f.Lag().Round(time.Microsecond), f.Advanced(), f.Resyncs(), pos, lastErr, dur(time.Since(started)))
	})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, nil
}

// openGuardStore opens the guard.Store over the marks guard install's
// functions keep at t, and checks that it answers.
func openGuardStore(ctx context.Context, t *guardTarget, raw string) (guard.Store, func(), error) {
	pctx, cancel := context.WithTimeout(ctx, installTimeout)
	defer cancel()
	switch t.kind {
	case "s3":
		s, err := openS3Store(pctx, t)
		if err != nil {
			return nil, nil, err
		}
		return s, func() {}, nil
	case "redis":
		redis.SetLogger(quietRedis{})
		opt, err := redis.ParseURL(raw)
		if err != nil {
			return nil, nil, err
		}
		rdb := redis.NewClient(opt)
		if err := rdb.Ping(pctx).Err(); err != nil {
			rdb.Close()
			return nil, nil, fmt.Errorf("cannot reach the server: %w", err)
		}
		return redisguard.NewStore(rdb), func() { rdb.Close() }, nil
	default:
		driver, dsn, d := "pgx", raw, sqlguard.Postgres
		if t.kind == "mysql" {
			var err error
			if dsn, err = mysqlDSN(t.url); err != nil {
				return nil, nil, usage(err)
			}
			driver, d = "mysql", sqlguard.MySQL
		}
		db, err := sql.Open(driver, dsn)
		if err != nil {
			return nil, nil, err
		}
		if err := db.PingContext(pctx); err != nil {
			db.Close()
			return nil, nil, fmt.Errorf("cannot reach the server: %w", err)
		}
		s, err := sqlguard.New(db, d)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return s, func() { db.Close() }, nil
	}
}

// redactingWriter replaces secrets in what it writes: a driver's error,
// logged by the follower, may quote the connection string.
type redactingWriter struct {
	w       io.Writer
	secrets []string
}

func (r redactingWriter) Write(p []byte) (int, error) {
	s := redactedError{errors.New(string(p)), r.secrets}.Error()
	if _, err := io.WriteString(r.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}
