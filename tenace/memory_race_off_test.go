//go:build !race

package tenace_test

const raceEnabled = false
