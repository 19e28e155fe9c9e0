// Package app wires Tandem together: flags, configuration, the pool source (Kubernetes or
// file), metric scraping, the picker, the ext_proc and health servers and /metrics, and runs
// them until the context ends. It holds no routing logic; cmd/epp and tests call Run.
package app
