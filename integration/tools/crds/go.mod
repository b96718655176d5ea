// Pins the custom resource definitions the integration tests install on
// kube.sh's control plane, taken from the release module that ships them:
// the Prometheus operator's ServiceMonitor CRD (monitoring.coreos.com/v1) is
// example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml
// in the github.com/prometheus-operator/prometheus-operator module zip
// (v0.85.0 is release 0.85.0; the module proxy lists no other version of
// that module).
// integration/manifests_test.go fetches it with
//
//	go mod download -json github.com/prometheus-operator/prometheus-operator
//
// run here (the version from this file, verified against go.sum) and reads
// it from the module cache. Nothing builds or imports the module, so do not
// run go mod tidy here: it would drop the requirement. To move to another
// release, go get it here.
module github.com/switchboard-gw/switchboard/integration/tools/crds

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
