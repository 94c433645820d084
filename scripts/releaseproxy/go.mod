module tenace.dev/scripts/releaseproxy

go 1.25

require golang.org/x/mod v0.30.0
