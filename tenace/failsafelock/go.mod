module tenace.dev/tenace/failsafelock

go 1.25

require tenace.dev v0.0.0

// The core module is two directories up; go.work ties them for development,
// and this replace lets the module build on its own too.
replace tenace.dev => ../../
