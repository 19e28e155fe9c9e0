// Package health owns passive health: outlier detection per endpoint, modelled on Envoy's, as a
// reader of the outcome recorder (internal/outcome). It counts what happens to the requests
// Tandem routes and to the scrapes and probes of each endpoint — consecutive 5xx answers, and
// apart from them consecutive gateway failures (502/503/504, connect failures, streams that ended
// with no response, prefill-leg transport errors and timeouts, scrape timeouts) — and ejects an
// endpoint that crosses a threshold, or at once when its serving port refuses a connection. An
// ejection lasts the base ejection time times the number of ejections (less those forgiven while
// the endpoint stayed in rotation), capped; the endpoint returns only once that time has passed
// and a scrape or probe of it succeeded, never on time alone; a returned endpoint whose next
// request fails is ejected again at once. A cap per model and role group keeps Tandem from
// ejecting everything.
//
// The router asks Partition for every pick, so every strategy sees the same filter: an ejected
// endpoint is never a candidate, and one demoted for its recent failures (k consecutive failures
// demote it for k recent-failure windows) is a candidate only when the request cannot be served
// without it (failing fast is not idleness). Partition reads atomics only. The package must not pick, score or speak to gateways; it probes endpoints only to
// let an ejected one return.
package health
