// Package bpflb tests the eBPF socket load balancer (package bpf) against the real kernel: a
// client namespace and a backend namespace joined by a veth, a cgroup2 child per test that
// the hooks attach to, client processes started inside that cgroup, and backends that answer
// with their own address so that the test can tell which one a connection reached. They need
// root and skip without it.
//
// Run them with: go test -v -count=1 ./tests/netns/bpflb/
package bpflb
