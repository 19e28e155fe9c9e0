package config

// FlagDoc documents one epp command-line flag in the reference.
type FlagDoc struct{ Name, Default, Description string }

// LimitFlags are the epp flags that bound what clients can make Tandem hold, and whom it
// trusts to write PD control fields. internal/app declares them with these names, defaults and
// descriptions (its tests check they agree); they are listed here so the reference shows them.
var LimitFlags = []FlagDoc{
	{"max-streams", "4096",
		"Most ext_proc streams (requests in flight through this replica, each until its response ends) open at once; the next request is answered 429 with `Retry-After: 1` at once."},
	{"max-buffered-body-bytes", "201326592",
		"Memory, in bytes, all streams together may hold in request bodies while they arrive; a body chunk that does not fit is answered 503 with `Retry-After: 1` and its body dropped. A body that arrives whole in one message is never refused. Must be at least `--max-body-bytes`."},
	{"request-body-timeout", "1m0s",
		"Longest time a request body may take to arrive after its headers; a slower one is answered 408. `0` disables."},
	{"max-body-bytes", "10485760", "Largest request body accepted; a larger one is answered 413."},
	{"trust-client-pd-fields", "false",
		"Forward client-sent PD control fields (`kv_transfer_params`, `disagg_prefill_resp`, `bootstrap_host`/`_port`/`_room`, `disaggregated_params`) instead of removing them. Only for clients that are part of the serving system: these fields name the host a pod connects to."},
}
