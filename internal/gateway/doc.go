// Package gateway owns a small local data plane for tests and the demo: an HTTP server that
// calls an Endpoint Picker over Envoy ext_proc exactly as Envoy's filter does in the Gateway
// API processing mode, then proxies to the endpoint it names. It is test tooling, not a
// product (production uses Envoy-based gateways through the manifests), and it must not
// schedule, know engines, or import Tandem's EPP packages.
package gateway
