package actor_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"tenace.dev/tenace/actor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sum is a tiny actor state: the loop adds every message to total and
// answers queries on a reply channel.
type msg struct {
	add   int
	query chan int // buffer 1
}

func startSum(t *testing.T, opts actor.Options[msg]) *actor.Actor[msg] {
	total := 0
	a := actor.Start(func(batch []msg) {
		for _, m := range batch {
			total += m.add
			if m.query != nil {
				m.query <- total
			}
		}
	}, opts)
	t.Cleanup(a.Stop)
	return a
}

func query(t *testing.T, a *actor.Actor[msg]) int {
	q := make(chan int, 1)
	require.NoError(t, a.Send(context.Background(), msg{query: q}))
	return <-q
}

func TestMessagesAreHandledInOrderByTheLoop(t *testing.T) {
	a := startSum(t, actor.Options[msg]{})
	for i := 1; i <= 100; i++ {
		require.NoError(t, a.Send(context.Background(), msg{add: i}))
	}
	require.Equal(t, 5050, query(t, a))
}

// stuckRecorder starts an actor that records each batch's size and, on its
// first batch, signals entered and waits for release: messages sent
// meanwhile queue up. A message with a query gets the batch count.
func stuckRecorder(t *testing.T, opts actor.Options[msg]) (a *actor.Actor[msg], batches *[]int, entered, release chan struct{}) {
	t.Helper()
	entered, release = make(chan struct{}), make(chan struct{})
	batches = new([]int)
	a = actor.Start(func(batch []msg) {
		*batches = append(*batches, len(batch))
		if len(*batches) == 1 {
			close(entered)
			<-release
		}
		for _, m := range batch {
			if m.query != nil {
				m.query <- len(*batches)
			}
		}
	}, opts)
	t.Cleanup(a.Stop)
	require.NoError(t, a.Send(context.Background(), msg{}))
	<-entered
	return a, batches, entered, release
}

func TestQueuedMessagesAreDrainedInOneBatch(t *testing.T) {
	// Hold the loop inside the handler while 9 more messages queue up; the
	// next batch must then take all of them at once.
	a, batches, _, release := stuckRecorder(t, actor.Options[msg]{Mailbox: 16})
	for range 8 {
		require.NoError(t, a.Send(context.Background(), msg{}))
	}
	q := make(chan int, 1)
	require.NoError(t, a.Send(context.Background(), msg{query: q}))
	close(release)
	require.Equal(t, 2, <-q, "the nine queued messages arrive in the second batch")
	require.Equal(t, []int{1, 9}, *batches)
}

func TestBatchIsCapped(t *testing.T) {
	a, batches, _, release := stuckRecorder(t, actor.Options[msg]{Mailbox: 16, Batch: 4})
	for range 9 {
		require.NoError(t, a.Send(context.Background(), msg{}))
	}
	q := make(chan int, 1)
	require.NoError(t, a.Send(context.Background(), msg{query: q}))
	close(release)
	require.Equal(t, 4, <-q, "ten queued messages in batches of at most four")
	require.Equal(t, []int{1, 4, 4, 2}, *batches)
}

func TestStopIsIdempotentAndWaitsForTheLoop(t *testing.T) {
	stopped := false
	a := actor.Start(func([]msg) {}, actor.Options[msg]{OnStop: func() { stopped = true }})
	a.Stop()
	// Stop returned, so the loop has exited: OnStop ran (the race detector
	// checks that Stop synchronizes with it) and Done is closed.
	require.True(t, stopped)
	select {
	case <-a.Done():
	default:
		t.Fatal("Done is not closed after Stop returned")
	}
	a.Stop()
	a.Stop()
}

func TestSendAfterStopFailsAtOnce(t *testing.T) {
	a := actor.Start(func([]msg) {}, actor.Options[msg]{Mailbox: 1})
	a.Stop()
	for range 3 { // more sends than the mailbox holds: none may block
		require.ErrorIs(t, a.Send(context.Background(), msg{}), actor.ErrStopped)
	}
}

// fullActor returns an actor whose loop is stuck in its handler (until
// release is closed) and whose one-slot mailbox is full, so the next Send
// must wait.
func fullActor(t *testing.T) (a *actor.Actor[msg], release chan struct{}) {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	a = actor.Start(func([]msg) {
		select {
		case <-entered:
		default:
			close(entered)
		}
		<-release
	}, actor.Options[msg]{Mailbox: 1})
	require.NoError(t, a.Send(context.Background(), msg{})) // taken by the loop, which blocks
	<-entered
	require.NoError(t, a.Send(context.Background(), msg{})) // fills the mailbox
	return a, release
}

func TestSendToAFullMailboxGivesUpWhenCtxEnds(t *testing.T) {
	a, release := fullActor(t)
	defer a.Stop()
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := a.Send(ctx, msg{})
	require.True(t, errors.Is(err, context.Canceled), "got %v", err)
}

func TestSendBlockedOnAFullMailboxFailsWhenStopped(t *testing.T) {
	a, release := fullActor(t)
	result := make(chan error, 1)
	go func() { result <- a.Send(context.Background(), msg{}) }()
	stopped := make(chan struct{})
	go func() { a.Stop(); close(stopped) }()
	// The blocked send must fail with ErrStopped (stopping is closed before
	// the loop can take anything more) — or, if the scheduler let it in
	// before Stop, succeed; it must never hang.
	close(release)
	<-stopped
	err := <-result
	if err != nil {
		require.ErrorIs(t, err, actor.ErrStopped)
	}
}

func TestStartPanicsOnMisuse(t *testing.T) {
	require.PanicsWithValue(t, "tenace: actor.Start: nil handler", func() {
		actor.Start[msg](nil, actor.Options[msg]{})
	})
	require.Panics(t, func() { actor.Start(func([]msg) {}, actor.Options[msg]{Mailbox: -1}) })
}

func TestGoOptionStartsTheLoop(t *testing.T) {
	started := false
	a := actor.Start(func([]msg) {}, actor.Options[msg]{Go: func(loop func()) {
		started = true
		go loop()
	}})
	a.Stop()
	require.True(t, started)
}
