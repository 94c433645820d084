module tenace.dev/tenace/failsafelock

go 1.25

require tenace.dev v0.1.0
