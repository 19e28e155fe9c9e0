// Package conformance_test holds Tandem's Endpoint Picker Protocol conformance suites: the
// protocol suite drives Tandem's real ext_proc listener exactly as Envoy's filter does
// (client in conformance/envoy), and upstream_test.go stands Tandem in for lwepp on the
// upstream conformance resources in a real kube-apiserver. It has tests only; it must not be
// imported, must not copy upstream files (they are read from the module cache at test time),
// and must not mock what runs here for real.
package conformance_test
