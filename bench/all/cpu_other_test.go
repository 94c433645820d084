//go:build !unix

package main

import "time"

// processCPU: see cpu_unix_test.go; not read on this system.
func processCPU() time.Duration { return -1 }
