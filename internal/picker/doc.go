// Package picker owns the scheduling contract between the ext_proc server and the
// strategies: the Scheduler interface, the Decision it returns (destination with
// fallbacks, prefill target, headers, body, trace) and the lifecycle hooks a decision
// receives as the response flows back. It must not know engine wire formats.
package picker
