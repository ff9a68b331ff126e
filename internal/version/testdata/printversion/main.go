// Command printversion prints version.Get() as fenced --version does, for
// the package's test of a real build.
package main

import (
	"fmt"

	"github.com/fence-dev/fence/internal/version"
)

func main() { fmt.Print(version.Get().Text("printversion")) }
