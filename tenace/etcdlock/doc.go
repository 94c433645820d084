// Package etcdlock is a tenace.LockProvider on an etcd cluster (v3 API).
package etcdlock
