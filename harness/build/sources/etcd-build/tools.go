//go:build tools

// Package tools pins the etcd commands the harness builds into the
// registry.k8s.io/etcd image (etcd and etcdctl, as upstream ships them).
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
