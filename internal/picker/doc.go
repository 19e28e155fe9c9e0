// Package picker owns the scheduling contract between the ext_proc server and the
// strategies (Scheduler, Decision, Lifecycle), the plugin framework strategies are built
// from (one interface per extension point in framework.go, one Registry of documented
// plugin types, a Handle through which plugins reach each other, per-request CycleState
// under typed keys), the file loader that turns a --config-file's plugins and profiles into
// strategies (FromFile), the non-PD plugins of GIE and llm-d and Tandem's own (one per file,
// register.go lists them), the non-PD strategies (random, least-request, prefix-cache) and the
// Router that resolves a request's strategy and runs it. It must not know engine wire
// formats; the PD plugins live in internal/pd.
package picker
