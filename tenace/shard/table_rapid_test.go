package shard_test

import (
	"testing"

	"pgregory.net/rapid"

	"tenace.dev/internal/proptest"
)

// TestTableMatchesModel is the state-machine property of the lock table
// against a plain FIFO model (see proptest.TableProperty).
func TestTableMatchesModel(t *testing.T) { rapid.Check(t, proptest.TableProperty) }

// TestSharedTableMatchesModel is the state-machine property with shared
// holders and permit counts (see proptest.SharedTableProperty).
func TestSharedTableMatchesModel(t *testing.T) { rapid.Check(t, proptest.SharedTableProperty) }
