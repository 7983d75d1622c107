//go:build tools

// Package tools pins the e2e test image commands the conformance suite
// builds locally (harness/build/e2eimages.py): agnhost, nonewprivs and the
// sample-apiserver used by the aggregator conformance test, plus the ginkgo
// CLI that runs e2e.test in parallel.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/nonewprivs"
	_ "k8s.io/sample-apiserver"
)
