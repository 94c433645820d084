// An adopter of tenace: a module outside the repository that requires the
// published modules with no replace line. `make release-check` copies this
// directory out of the workspace, points GOPROXY at the modules zipped from
// the working tree, and runs these tests there. It is in go.work too, so that
// make test-race and lint also build and test it against the working tree;
// only release-check proves it resolves as published.
module example.com/adopter

go 1.25

require (
	tenace.dev v0.1.0
	tenace.dev/tenace/etcdlock v0.1.0
	tenace.dev/tenace/failsafelock v0.1.0
	tenace.dev/tenace/lockhttp v0.1.0
	tenace.dev/tenace/oteltenace v0.1.0
	tenace.dev/tenace/pglock v0.1.0
	tenace.dev/tenace/redislock v0.1.0
)
