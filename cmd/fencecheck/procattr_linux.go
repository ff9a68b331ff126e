package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the child get SIGKILL if fencecheck dies first, so a
// crashed or killed run leaves no fenced, resource or worker behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
