// Package failsafelock runs a tenace lock as a failsafe-go policy.
package failsafelock
