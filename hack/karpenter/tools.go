//go:build tools

// Package tools pins Karpenter (kwok cloud provider) for the local test bed.
package tools

import _ "sigs.k8s.io/karpenter/kwok"
