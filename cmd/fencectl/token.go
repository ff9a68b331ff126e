package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/signing"
)

// verifyJSON is token verify's -o json output.
type verifyJSON struct {
	Valid   bool   `json:"valid"`
	Scope   string `json:"scope"`
	Token   uint64 `json:"token"`
	LeaseID string `json:"lease_id"`
	KeyID   string `json:"key_id"`
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
		Long: `Verify checks that TOKEN (the text form, fence:v2:...) is signed by the
service: by one of the public keys it serves at /keys (fetched from --addr),
or of a key file given with --keys (the same JSON). It exits 0 for a valid
signature, 1 for a token that does not verify (forged, altered, unsigned,
or signed by a key retired or unknown), 2 for text that is not a token.

A valid signature proves the service issued that token for that scope and
lease; whether it is still the newest is for the guard to decide.`,
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
			out := verifyJSON{Valid: true, Scope: tok.Scope, Token: tok.Value, LeaseID: tok.LeaseID.String(), KeyID: tok.KeyID}
			return a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "valid: %s token %d, lease %s, signed by key %s\n", tok.Scope, tok.Value, tok.LeaseID, tok.KeyID)
			})
		}),
	}
	cmd.Flags().StringVar(&keysFile, "keys", "", "a key file (JSON, as fenced serves at /keys) instead of fetching the keys from --addr")
	return cmd
}

func (a *app) newTokenRotateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rotate-key",
		Short: "Make the service sign with a new key from now on",
		Long: `Rotate-key makes fenced sign every token granted from now on with a new key.
Tokens signed with the previous keys keep verifying for fenced's
--key-grace (24h by default); guards that fetch the keys from the service
pick up the new key by themselves when they first meet it.`,
		Args: exactArgs(),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			kid, err := c.RotateSigningKey(cmd.Context())
			if err != nil {
				return err
			}
			return a.emit(map[string]string{"key_id": kid}, func(w io.Writer) {
				fmt.Fprintf(w, "signing with key %s from now on\n", kid)
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
