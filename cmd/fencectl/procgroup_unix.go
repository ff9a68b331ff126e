//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// canExec reports whether exec can run commands in their own process group.
const canExec = true

// setProcessGroup makes cmd the leader of a new process group, so signals
// sent to the group reach the processes it starts as well.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// signalGroup sends sig to the process group that pid leads.
func signalGroup(pid int, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return nil
	}
	return syscall.Kill(-pid, s)
}

// exitStatus is the status a shell would report: the exit code, or 128+N
// for a process killed by signal N.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
