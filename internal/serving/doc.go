// Package serving owns Tandem's gRPC listeners: the ext_proc server (TLS by default, with a
// self-signed certificate or a reloaded --cert-path pair), the gRPC health server that turns
// SERVING once the pool has synced, and graceful shutdown. It must not implement the
// protocol (extproc does) nor discover endpoints (pool sources do).
package serving
