// Package keyfmt quotes a lock key for an error message.
package keyfmt

import (
	"strconv"
	"unicode/utf8"
)

// Max is the most bytes of a key an error message quotes. Keys often come
// from a request (a customer id, a path): a message must not grow with
// whatever a caller sent, or one long key would fill a log.
const Max = 256

// Quote returns key quoted as %q does, cut after its first Max bytes (at a
// UTF-8 boundary) and followed by its length when it is longer. The error
// values keep the whole key in their fields: only the message is cut.
func Quote(key string) string {
	if len(key) <= Max {
		return strconv.Quote(key)
	}
	n := Max
	for n > Max-utf8.UTFMax && !utf8.RuneStart(key[n]) {
		n--
	}
	return strconv.Quote(key[:n]) + "… (" + strconv.Itoa(len(key)) + " bytes)"
}

// Label returns an owner label for a message: as it is when it is valid
// UTF-8 of printable characters and at most Max bytes, else quoted and cut
// as Quote does, so that a label cannot forge lines or escapes in a log.
func Label(label string) string {
	if len(label) <= Max && utf8.ValidString(label) {
		printable := true
		for _, r := range label {
			if !strconv.IsPrint(r) {
				printable = false
				break
			}
		}
		if printable {
			return label
		}
	}
	return Quote(label)
}
