//go:build tools

// Package tools pins the CoreDNS command the harness builds into the
// registry.k8s.io/coredns/coredns image.
package tools

import (
	_ "github.com/coredns/coredns"
)
