//go:build !unix

package raftnode

import "errors"

func freeSpace(string) (uint64, error) {
	return 0, errors.New("free space is not measured on this system")
}
