//go:build !unix

package server

// openFilesLimit is 0 where there is no RLIMIT_NOFILE: the defaults then
// assume 20,000.
func openFilesLimit() uint64 { return 0 }
