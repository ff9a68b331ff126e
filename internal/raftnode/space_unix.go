//go:build unix

package raftnode

import "syscall"

// freeSpace returns the bytes an unprivileged writer may still use on the
// file system of dir.
func freeSpace(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}
