package noreply

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"tenace.dev/tenace"
)

func TestUnansweredCountsToTheDeadlineNotToNow(t *testing.T) {
	sent := time.Now().Add(-time.Hour)
	// A deadline that passed: the silence ends there, however late the
	// caller looks.
	ctx, cancel := context.WithDeadline(context.Background(), sent.Add(100*time.Millisecond))
	defer cancel()
	if got := Unanswered(ctx, sent); got != 100*time.Millisecond {
		t.Errorf("Unanswered with a passed deadline = %v, want 100ms", got)
	}
	// No deadline (a Timeout on another clock): until now.
	if got := Unanswered(context.Background(), sent); got < time.Hour {
		t.Errorf("Unanswered without a deadline = %v, want at least 1h", got)
	}
	// A deadline still ahead: until now too.
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(time.Hour))
	defer cancel()
	if got := Unanswered(ctx, sent); got < time.Hour || got >= 2*time.Hour {
		t.Errorf("Unanswered with a deadline ahead = %v, want about 1h", got)
	}
}

func TestErrorIsTheProvidersMessageAndUnwrapsToTenaceErrNoReply(t *testing.T) {
	var err error = Error("no reply from the server")
	if err.Error() != "no reply from the server" {
		t.Errorf("Error() = %q, want the provider's message", err.Error())
	}
	if !errors.Is(fmt.Errorf("acquiring: %w", err), tenace.ErrNoReply) {
		t.Error("a wrapped Error is not tenace.ErrNoReply")
	}
}
