module tenace.dev/tenace/etcdlock

go 1.25

require tenace.dev v0.1.0
