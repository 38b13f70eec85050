//go:build tools

// Package tools pins the kwok controller the test bed builds.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
