//go:build tools

// Package tools pins the cluster-autoscaler command the test bed builds (with -tags kwok).
package tools

import (
	_ "k8s.io/autoscaler/cluster-autoscaler"
)
