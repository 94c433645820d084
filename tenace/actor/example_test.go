package actor_test

import (
	"context"
	"fmt"

	"tenace.dev/tenace/actor"
)

// counterMsg is a message to a counter actor: add to the total, or, with
// a reply channel, ask for it.
type counterMsg struct {
	add   int
	reply chan int
}

// An actor owns its state alone: here a total that only the loop reads
// and writes. Senders add to it and ask for it by messages; no mutex.
func Example() {
	total := 0 // owned by the loop goroutine
	a := actor.Start(func(batch []counterMsg) {
		for _, m := range batch {
			total += m.add
			if m.reply != nil {
				m.reply <- total
			}
		}
	}, actor.Options[counterMsg]{})
	defer a.Stop()

	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		if err := a.Send(ctx, counterMsg{add: i}); err != nil {
			fmt.Println(err)
			return
		}
	}
	reply := make(chan int, 1) // a buffer of one: the loop never blocks on it
	if err := a.Send(ctx, counterMsg{reply: reply}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-reply) // the mailbox is FIFO: every add came first
	// Output: 10
}
