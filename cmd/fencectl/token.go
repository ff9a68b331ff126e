package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/signing"
)

// verifyJSON is token verify's -o json output.
type verifyJSON struct {
	Valid bool   `json:"valid"`
	Scope string `json:"scope"`
	Token uint64 `json:"token,string"` // a 64-bit integer: a string, as protojson writes it
	KeyID string `json:"keyId"`
}

func (a *app) newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Check signed tokens and rotate the service's signing key",
		Args:  groupArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.newTokenVerifyCmd(), a.newTokenRotateCmd())
	return cmd
}

func (a *app) newTokenVerifyCmd() *cobra.Command {
	var keysFile string
	cmd := &cobra.Command{
		Use:   "verify TOKEN",
		Short: "Check a token's signature against the service's public keys",
		Long: `Verify checks that TOKEN (the text form, fence:v3:...) is signed by the
service: by one of the public keys it serves at /keys (fetched from --addr),
or of a key file given with --keys (the same JSON). It exits 0 for a valid
signature, 1 for a token that does not verify (forged, altered, unsigned,
or signed by a key retired or unknown), 2 for text that is not a token.

A valid signature proves the service issued that token for that scope and
value; whether it is still the newest is for the guard to decide. Tokens
of the older signed form, fence:v2:..., verify too.`,
		Example: `  fencectl token verify "$FENCE_TOKEN"
  fencectl token verify "$FENCE_TOKEN" --keys keys.json -o json`,
		Args: exactArgs("TOKEN"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			tok, err := fence.ParseToken(args[0])
			if err != nil {
				return usage(err)
			}
			var keys *signing.KeySet
			if keysFile != "" {
				keys, err = signing.Load(keysFile)
			} else {
				keys, err = a.fetchKeys(cmd.Context())
			}
			if err != nil {
				return err
			}
			if err := keys.Verify(tok); err != nil {
				return &statusError{code: exitError, name: "invalid_signature", err: err}
			}
			out := verifyJSON{Valid: true, Scope: tok.Scope, Token: tok.Value, KeyID: tok.KeyID}
			return a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "valid: %s token %d, signed by key %s\n", tok.Scope, tok.Value, tok.KeyID)
			})
		}),
	}
	cmd.Flags().StringVar(&keysFile, "keys", "", "a key file (JSON, as fenced serves at /keys) instead of fetching the keys from --addr")
	return cmd
}

func (a *app) newTokenRotateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rotate-key",
		Short: "Add a new signing key: published now, signing after fenced's --key-publish-delay",
		Long: `Rotate-key adds a new signing key to fenced. The service publishes it at
/keys at once and signs every token granted from fenced's --key-publish-delay
(5m by default) later on with it; until then the previous key signs, so
guards that fetch the keys from the service (signing.Refreshing, with an
interval below that delay) know the new key before any token carries it.
Tokens signed with the previous keys keep verifying for fenced's
--key-grace (24h by default) after the new key starts. It prints the new
key's ID and when it starts to sign.`,
		Args: exactArgs(),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := c.RotateSigningKey(cmd.Context())
			if err != nil {
				return err
			}
			out := &fencev1.RotateSigningKeyResponse{KeyId: r.KeyID}
			if !r.SignsFrom.IsZero() { // zero from a service that signs with it at once and does not say
				out.SignsFrom = timestamppb.New(r.SignsFrom)
			}
			return a.emit(out, func(w io.Writer) {
				if wait := time.Until(r.SignsFrom); wait > 0 {
					fmt.Fprintf(w, "key %s is published at /keys and signs from %s (in %v); the previous key signs until then\n",
						r.KeyID, r.SignsFrom.UTC().Format(time.RFC3339), wait.Round(time.Second))
					return
				}
				fmt.Fprintf(w, "signing with key %s from now on\n", r.KeyID)
			})
		}),
	}
}

// fetchKeys gets the service's public keys from --addr, over TLS when the
// TLS flags ask for it.
func (a *app) fetchKeys(ctx context.Context) (*signing.KeySet, error) {
	tc, err := a.tls.config()
	if err != nil {
		return nil, usage(err)
	}
	if tc == nil {
		return signing.Fetch(ctx, nil, a.addr)
	}
	var urls []string
	for addr := range strings.SplitSeq(a.addr, ",") {
		if addr = strings.TrimSpace(addr); !strings.Contains(addr, "://") {
			addr = "https://" + addr
		}
		urls = append(urls, addr)
	}
	return signing.Fetch(ctx, &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}, strings.Join(urls, ","))
}
