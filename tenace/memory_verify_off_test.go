//go:build !tenace_verify

package tenace_test

const verifying = false
