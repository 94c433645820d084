module tenace.dev/tenace/failsafelock

go 1.25

require (
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/redis/go-redis/v9 v9.17.3
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	tenace.dev v0.1.0
)

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

// The Redis tests use the Redis provider, a module of its own beside this
// one (the lead converts these lines to published versions with the rest).
require tenace.dev/tenace/redislock v0.1.0
