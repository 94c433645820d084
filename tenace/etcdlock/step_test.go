package etcdlock

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStep: every decision of the acquire path, from the call's state and
// etcd's reply alone, with no server.
func TestStep(t *testing.T) {
	boom := errors.New("boom")
	lost := errors.New("lost")
	wait, noWait := call{key: "k"}, call{key: "k", noWait: true}
	for _, tc := range []struct {
		name    string
		c       call
		r       reply
		next    next
		held    bool
		err     error  // errors.Is the decision's error
		errText string // in its message
	}{
		{"grant failed", wait, reply{req: reqGrant, err: boom}, outFailed, false, boom, "granting an etcd lease for"},
		{"grant failed past the end", wait, reply{req: reqGrant, err: boom, ended: true}, outFailed, false, boom, "granting"},
		{"granted too late", wait, reply{req: reqGrant, ended: true}, outFailed, false, errEnded, ""},
		{"granted", wait, reply{req: reqGrant}, doQueue, false, nil, ""},

		{"queueing failed", wait, reply{req: reqQueue, err: boom}, outFailed, false, boom, "queueing for"},
		{"spare gone at the queueing: a fresh lease", wait, reply{req: reqQueue, err: boom, spareGone: true}, doRegrant, false, nil, ""},
		{"spare gone, NoWait: a fresh lease", noWait, reply{req: reqQueue, err: boom, spareGone: true}, doRegrant, false, nil, ""},
		{"spare gone as the wait ended", wait, reply{req: reqQueue, err: boom, spareGone: true, ended: true, timedOut: true}, outFailed, false, boom, "queueing for"},
		{"entry vanished at the queueing", wait, reply{req: reqQueue, gone: true}, outFailed, false, nil, "entry vanished"},
		{"head of the queue", wait, reply{req: reqQueue, admitted: true}, doGrant, false, nil, ""},
		{"head within lateReply past the Timeout", wait, reply{req: reqQueue, admitted: true, ended: true, timedOut: true}, doGrant, false, nil, ""},
		{"head as ctx ended", wait, reply{req: reqQueue, admitted: true, ended: true}, outFailed, false, errEnded, ""},
		{"held, NoWait", noWait, reply{req: reqQueue}, outHeld, true, nil, ""},
		{"held, NoWait, past the end", noWait, reply{req: reqQueue, ended: true}, outHeld, true, nil, ""},
		{"held, the wait ended", wait, reply{req: reqQueue, ended: true, timedOut: true}, outFailed, true, errEnded, ""},
		{"held: wait", wait, reply{req: reqQueue}, doLook, true, nil, ""},

		{"look failed as the wait ended", wait, reply{req: reqLook, err: boom, ended: true}, outFailed, false, boom, "waiting for"},
		{"look failed, lease lost", wait, reply{req: reqLook, err: boom, lost: true, lostErr: lost}, outFailed, false, lost, "waiting for"},
		{"look failed for now", wait, reply{req: reqLook, err: boom}, doPause, false, nil, ""},
		{"place vanished", wait, reply{req: reqLook, gone: true}, outFailed, false, nil, "place in the queue vanished"},
		{"admitted", wait, reply{req: reqLook, admitted: true}, doGrant, false, nil, ""},
		{"admitted as the wait ended", wait, reply{req: reqLook, admitted: true, ended: true, timedOut: true}, outFailed, false, errEnded, ""},
		{"still behind", wait, reply{req: reqLook}, doWatch, false, nil, ""},

		{"watch: lease lost", wait, reply{req: reqWatch, lost: true, lostErr: lost, ended: true}, outFailed, false, lost, "waiting for"},
		{"watch: the wait ended", wait, reply{req: reqWatch, ended: true}, outFailed, false, errEnded, ""},
		{"watch: look again", wait, reply{req: reqWatch}, doLook, false, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := step(tc.c, tc.r)
			require.Equal(t, tc.next, d.next)
			require.Equal(t, tc.held, d.held)
			if tc.next != outFailed {
				require.NoError(t, d.err)
				return
			}
			require.Error(t, d.err)
			if tc.err != nil {
				require.ErrorIs(t, d.err, tc.err)
			}
			require.Contains(t, d.err.Error(), tc.errText)
			if tc.err != errEnded {
				require.Contains(t, d.err.Error(), `"k"`, "the error names the key")
			}
		})
	}
	require.Panics(t, func() { step(wait, reply{req: request(99)}) })
}
