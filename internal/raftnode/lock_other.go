//go:build !unix

package raftnode

import "os"

// lockDir takes no lock where flock does not exist: bbolt's own lock on the
// log store then keeps a second node out, by waiting.
func lockDir(string) (*os.File, error) { return nil, nil }
