//go:build !unix

package main

import (
	"errors"
	"os"
	"os/exec"
)

// canExec reports whether exec can run commands in their own process group.
const canExec = false

func setProcessGroup(*exec.Cmd) {}

func signalGroup(int, os.Signal) error { return errors.ErrUnsupported }

func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }
