//go:build unix

package server

import "syscall"

// openFilesLimit is the process's limit on open file descriptors
// (RLIMIT_NOFILE; Go raises the soft limit to the hard one at start), or 0
// if it cannot be read.
func openFilesLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}
