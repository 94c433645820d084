package clock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/internal/fakeclock"
)

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
	fmt.Println(wait(fakeclock.New()))
	// Output:
	// time package: real deadlines for the client
	// time package: real deadlines for the client
	// the clock's timers: the test drives time
}

// A context that ends once a second has passed on a test clock, with a cause
// that says why.
func ExampleWithTimeoutCause() {
	errSlow := errors.New("the lock was not granted within its timeout")
	clk := fakeclock.New()
	ctx, cancel := clock.WithTimeoutCause(context.Background(), clk, time.Second, errSlow)
	defer cancel()
	fmt.Println(ctx.Err())
	clk.Advance(time.Second)
	fmt.Println(ctx.Err(), "|", context.Cause(ctx))
	// Output:
	// <nil>
	// context deadline exceeded | the lock was not granted within its timeout
}
