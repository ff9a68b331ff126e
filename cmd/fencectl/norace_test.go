//go:build !race

package main

// race is true when the tests run with -race.
const race = false
