package clock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tenace.dev/tenace/clock"
)

// offsetClock is a test's clock: the system clock an hour ahead.
type offsetClock struct{ clock.Clock }

func (c offsetClock) Now() time.Time { return c.Clock.Now().Add(time.Hour) }

// A lock provider takes the Clock of its options (nil: the system clock):
// with the system clock it can hand its client a context with a real
// deadline, and with a test clock the test moves time.
func ExampleIsSystem() {
	wait := func(c clock.Clock) string {
		if clock.IsSystem(c) {
			return "time package: real deadlines for the client"
		}
		return "the clock's timers: the test drives time"
	}
	fmt.Println(wait(nil))
	fmt.Println(wait(clock.System()))
	fmt.Println(wait(offsetClock{clock.System()}))
	// Output:
	// time package: real deadlines for the client
	// time package: real deadlines for the client
	// the clock's timers: the test drives time
}

// A context that ends once its time has passed on the clock, with a cause
// that says why; on the system clock it is context.WithTimeoutCause.
func ExampleWithTimeoutCause() {
	errSlow := errors.New("the lock was not granted within its timeout")
	ctx, cancel := clock.WithTimeoutCause(context.Background(), clock.System(), time.Millisecond, errSlow)
	defer cancel()
	<-ctx.Done()
	fmt.Println(ctx.Err(), "|", context.Cause(ctx))
	// Output: context deadline exceeded | the lock was not granted within its timeout
}
