//go:build !linux

package main

import "os/exec"

// dieWithParent is a no-op where there is no parent-death signal; the
// workers still stop by themselves at the end of their time.
func dieWithParent(*exec.Cmd) {}
