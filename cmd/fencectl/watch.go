package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
)

// eventOut is one line of watch's -o json output: the event as the API's
// WatchEvent.
func eventOut(e client.Event) *fencev1.WatchEvent {
	out := &fencev1.WatchEvent{
		Position: e.Position,
		// The API names kind "granted" EVENT_KIND_GRANTED, and so on.
		Kind:          fencev1.EventKind(fencev1.EventKind_value["EVENT_KIND_"+strings.ToUpper(string(e.Kind))]),
		Scope:         e.Scope,
		Token:         e.Token,
		Holder:        e.Holder,
		LeaseIdPrefix: e.LeaseFingerprint,
		CurrentToken:  e.Current,
		Guard:         e.Guard,
		ClosingToken:  e.Closing,
	}
	if e.TTL != 0 {
		out.Ttl = durationpb.New(e.TTL)
	}
	if !e.Time.IsZero() {
		out.Time = timestamppb.New(e.Time)
	}
	return out
}

// eventText is one line of watch's text output.
func eventText(e client.Event) string {
	var b strings.Builder
	ts := "-"
	if !e.Time.IsZero() {
		ts = e.Time.Local().Format("15:04:05.000")
	}
	fmt.Fprintf(&b, "%s  %-8s  %s  token %d", ts, e.Kind, e.Scope, e.Token)
	if e.Holder != "" {
		fmt.Fprintf(&b, "  holder %q", e.Holder)
	}
	if e.LeaseFingerprint != "" {
		fmt.Fprintf(&b, "  lease %s", e.LeaseFingerprint)
	}
	switch e.Kind {
	case client.EventGranted, client.EventRenewed, client.EventHeld:
		fmt.Fprintf(&b, "  ttl %s", dur(e.TTL))
	case client.EventLost:
		fmt.Fprintf(&b, "  current token %d", e.Current)
	case client.EventRejected:
		fmt.Fprintf(&b, "  highest accepted %d  guard %q", e.Current, e.Guard)
	case client.EventReleased, client.EventExpired:
		if e.Closing != 0 {
			fmt.Fprintf(&b, "  closing token %d", e.Closing)
		}
	}
	if e.Position != 0 {
		fmt.Fprintf(&b, "  position %d", e.Position)
	}
	return b.String()
}

func (a *app) newWatchCmd() *cobra.Command {
	var (
		from  uint64
		held  bool
		count int
	)
	cmd := &cobra.Command{
		Use:   "watch [PREFIX]",
		Short: "Print lease events live: grants, renewals, releases, expiries, losses, stale rejections",
		Long: `Watch prints the lease events of every scope starting with PREFIX (all
scopes without one) as the service's leader records them, one line each,
until interrupted:

  granted   a new lease began, with a new token
  renewed   its holder renewed it; the token is unchanged (one a quarter
            of the lease's TTL at most)
  released  its holder released it
  expired   the service expired it: its holder stopped renewing
  lost      a renewal was answered lost (current token shown; once a lease)
  rejected  a guard refused a write with this stale token (highest accepted
            shown), as reported by the guard (once a token of a scope, and
            none while a tenth of the events kept are rejections)
  held      with --held: held when the watch began

Each event has a position. To resume after an interruption without missing
anything, pass the last position printed plus one as --from. The service
keeps the most recent ten thousand events, and a new leader starts afresh:
when the position is gone, watch fails (code missed_events) and the current
state must be read again (fencectl list, or watch --held).

With -o json it prints one JSON object per event, one per line, each the
API's WatchEvent: {"position", "kind" (EVENT_KIND_GRANTED, ...), "scope",
"token", "holder", "leaseIdPrefix", "ttl", "time", "currentToken",
"guard", "closingToken"}, fields at their zero value left out.
"leaseIdPrefix" is the lease ID's fingerprint (8 bytes of its SHA-256, in
hexadecimal): enough to tell leases apart, but it reveals nothing of the
ID, which renews and releases the lease.`,
		Example: `  fencectl watch
  fencectl watch orders/ --held
  fencectl watch -o json | jq -c 'select(.kind == "EVENT_KIND_EXPIRED")'
  fencectl watch orders/ --from 1099511627790`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageErrorf("unexpected argument %q: watch takes at most one PREFIX", args[1])
			}
			return nil
		},
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			if err := fence.ValidatePrefix(prefix); err != nil {
				return usage(err)
			}
			if count < 0 {
				return usageErrorf("--count %d: want 0 (no limit) or more", count)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var opts []client.WatchOption
			if held {
				opts = append(opts, client.WithHeld())
			}
			ctx := cmd.Context()
			n := 0
			for e, err := range c.Watch(ctx, prefix, from, opts...) {
				if err != nil {
					if ctx.Err() != nil && errors.Is(err, context.Canceled) {
						return nil // interrupted: the normal way to stop watching
					}
					return err
				}
				if err := a.emit(eventOut(e), func(w io.Writer) { fmt.Fprintln(w, eventText(e)) }); err != nil {
					return err
				}
				if n++; count > 0 && n == count {
					return nil
				}
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.Uint64Var(&from, "from", 0, "resume at this position (the last one printed plus one); 0: from now")
	f.BoolVar(&held, "held", false, "begin with a \"held\" line for every lease held under PREFIX now")
	f.IntVar(&count, "count", 0, "exit after this many events (0: watch until interrupted)")
	return cmd
}
