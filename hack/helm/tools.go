//go:build tools

// Package tools pins the helm CLI the chart tests build.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
