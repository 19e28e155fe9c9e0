// Package serving owns Tandem's gRPC listeners: the ext_proc server (TLS by default, with a
// self-signed certificate or a reloaded --cert-path pair), the gRPC health services of the
// Endpoint Picker Protocol (liveness; readiness and ext_proc's name, SERVING once the pool
// has synced and until shutdown begins), and graceful shutdown. It must not implement the
// protocol (extproc does) nor discover endpoints (pool sources do).
package serving
