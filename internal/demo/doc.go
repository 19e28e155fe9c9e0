// Package demo owns the one-command demo: it starts simulated prefill, decode and standard
// pods, Tandem with a file-sourced pool and the local gateway, all on loopback, replays a
// mixed slice of real traces through them and prints what happened. Partway through it can
// break one decode pod's KV connector (the simulator's recompute_kv fault), and the summary
// shows Tandem's transfer proof catching that pair. Its stack pieces (the endpoints file a pool
// is read from, the wait for Tandem's health) also serve the end-to-end tests, conformance and
// benchmarks. It must not be imported by production packages, and it starts nothing it does
// not stop.
package demo
