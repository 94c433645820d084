module tenace.dev

go 1.25

require github.com/cespare/xxhash/v2 v2.3.0
