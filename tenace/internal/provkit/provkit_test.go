package provkit

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"tenace.dev/tenace/internal/fakeclock"
)

type settings struct{ d time.Duration }

func TestDurationChecksThenSets(t *testing.T) {
	var s settings
	Duration(time.Second, time.Second, "x.WithD: too short", func(s *settings, d time.Duration) { s.d = d })(&s)
	if s.d != time.Second {
		t.Errorf("the option set %v, want 1s", s.d)
	}
	defer func() {
		if r := recover(); r != "tenace: x.WithD: too short" {
			t.Errorf("recovered %v, want the tenace: message", r)
		}
	}()
	Duration(time.Second-1, time.Second, "x.WithD: too short", func(*settings, time.Duration) { t.Error("set a duration that failed its check") })
}

func TestCapHoldTimesTheCallsTTLElseTheDefault(t *testing.T) {
	if CapHold(nil, 0, 0, func(time.Duration) { t.Error("fired without a TTL") }) != nil {
		t.Error("CapHold armed a timer with no TTL and no default")
	}
	clk := fakeclock.New()
	var got []time.Duration
	stop := CapHold(clk, 0, 3*time.Second, func(ttl time.Duration) { got = append(got, ttl) })
	if stop == nil {
		t.Fatal("CapHold armed no timer with a default")
	}
	CapHold(clk, time.Second, 3*time.Second, func(ttl time.Duration) { got = append(got, ttl) })
	clk.Advance(time.Second)
	if len(got) != 1 || got[0] != time.Second {
		t.Fatalf("after 1s: fired %v, want [1s] (the call's TTL over the default)", got)
	}
	if !(*stop)() {
		t.Error("the stop of the pending default-TTL timer reported it already fired")
	}
	clk.Advance(time.Hour)
	if len(got) != 1 {
		t.Errorf("a stopped timer fired: %v", got)
	}
}

func TestEndHeldEndsEachLeaseOnceOutsideTheLock(t *testing.T) {
	var mu sync.Mutex
	closed := false
	held := map[int]struct{}{1: {}, 2: {}}
	ended := map[int]int{}
	atClose := func() {
		if mu.TryLock() {
			t.Error("atClose ran without the lock held")
			mu.Unlock()
		}
	}
	end := func(l int) {
		if !mu.TryLock() {
			t.Error("end ran with the lock held")
		} else {
			mu.Unlock()
		}
		ended[l]++
	}
	if !EndHeld(&mu, &closed, held, atClose, end) || !closed {
		t.Fatal("the first EndHeld did not close the books")
	}
	if EndHeld(&mu, &closed, held, func() { t.Error("atClose ran twice") }, end) {
		t.Error("a second EndHeld reported it closed the books")
	}
	if len(ended) != 2 || ended[1] != 1 || ended[2] != 1 {
		t.Errorf("ended %v, want each lease once", ended)
	}
}

// stuck has a deadline that has passed and never reports its end.
type stuck struct{ context.Context }

func (stuck) Deadline() (time.Time, bool) { return time.Now().Add(-time.Second), true }

func TestAwaitDeadlineIsBoundedByOutcomeWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		AwaitDeadline(stuck{context.Background()})
		if got := time.Since(start); got != OutcomeWait {
			t.Errorf("AwaitDeadline on a context that never ends waited %v, want OutcomeWait (%v)", got, OutcomeWait)
		}
		start = time.Now()
		AwaitDeadline(context.Background()) // no deadline
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		AwaitDeadline(ctx) // a deadline ahead
		if got := time.Since(start); got != 0 {
			t.Errorf("AwaitDeadline waited %v on contexts with no deadline passed", got)
		}
	})
}
