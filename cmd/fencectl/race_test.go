//go:build race

package main

// race is true when the tests run with -race: TestMain then builds
// fencectl with the race detector too, so the processes it runs check
// exec's goroutines.
const race = true
