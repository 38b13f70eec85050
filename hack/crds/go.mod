// Pins the third-party CRDs the test bed installs. gangcheck/testbed/crds.py reads them from the
// Go module cache (`go mod download -json MODULE` run here); they are never copied into the repo.
// No Go code imports these modules: don't run `go mod tidy` here (it would drop them).
module gangcheck/hack/crds

go 1.26.0

require (
	k8s.io/autoscaler/cluster-autoscaler/apis v0.0.0-20240830133931-adfbe7e45277
	sigs.k8s.io/kueue v0.17.0
	sigs.k8s.io/scheduler-plugins v0.34.1-devel
)
