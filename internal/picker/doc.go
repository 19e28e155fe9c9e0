// Package picker owns the scheduling contract between the ext_proc server and the
// strategies (Scheduler, Decision, Lifecycle), the plugin framework strategies are built
// from (one interface per extension point, a registry by type name, per-request CycleState),
// the non-PD strategies (random, least-request, prefix-cache) and the Router that resolves a
// request's strategy through the configuration and runs it. It must not know engine wire
// formats; the PD cascade lives in internal/pd.
package picker
