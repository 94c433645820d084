package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"tenace.dev/bench/internal/load"
)

// sideBySide times one uncontended acquire+release of each locker per
// iteration of b's loop, in turn (the one that goes first rotates), on
// keys[i] for lockers[i], and returns each one's median: on a shared
// machine whose load swings within seconds, ops timed side by side
// compare where cells run one after another do not.
func sideBySide(ctx context.Context, b *testing.B, lockers []load.Locker, keys []string) []time.Duration {
	times := make([][]time.Duration, len(lockers))
	n := 0
	for b.Loop() {
		for j := range lockers {
			i := (j + n) % len(lockers)
			start := time.Now()
			if err := lockers[i].Do(ctx, keys[i], load.Noop); err != nil {
				b.Fatal(err)
			}
			times[i] = append(times[i], time.Since(start))
		}
		n++
	}
	medians := make([]time.Duration, len(times))
	for i, ts := range times {
		slices.Sort(ts)
		medians[i] = ts[len(ts)/2]
	}
	return medians
}
