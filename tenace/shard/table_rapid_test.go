package shard_test

import (
	"testing"

	"pgregory.net/rapid"

	"tenace.dev/internal/proptest"
)

// TestTableMatchesModel is the state-machine property of the lock table
// against a plain FIFO model (see proptest.TableProperty).
func TestTableMatchesModel(t *testing.T) { rapid.Check(t, proptest.TableProperty) }
