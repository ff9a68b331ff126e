package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"
)

func (a *app) newBackupCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "backup FILE",
		Short: "Save a backup of the lease state to FILE, for fenced --restore",
		Long: `Backup saves the service's lease state, as the leader holds it when the
call arrives, to FILE: every scope's counter, every lease and waiter, the
nodes and the signing keys. "fenced --restore FILE" starts a new cluster
from it, whose tokens start above every token the service ever issued,
after the backup included (the token floor: its wall clock). FILE is
written whole or not at all; it holds every lease ID and signing key, so
it is created readable by its owner only and must be kept as a secret.
With an auth file, the caller needs the "cluster" permission.`,
		Example: `  fencectl backup fence-$(date +%F).backup
  fenced --data-dir /var/lib/fenced-new --restore fence-2026-12-05.backup`,
		Args: exactArgs("FILE"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			path := args[0]
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			n, err := c.Backup(cmd.Context(), tmp)
			if err == nil {
				err = tmp.Sync()
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Rename(tmp.Name(), path)
			}
			if err != nil {
				return err
			}
			return a.emit(map[string]any{"file": path, "bytes": strconv.FormatInt(n, 10)}, func(w io.Writer) {
				fmt.Fprintf(w, "saved %d bytes to %s; restore with: fenced --data-dir NEW_DIR --restore %s\n", n, path, path)
			})
		}),
	}
}
