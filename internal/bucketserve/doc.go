// Package bucketserve owns the adaptive bucket-serving planner (AIBRIX_BUCKET_SERVE): a
// per-model, exponentially decayed log2 histogram of routed prompt lengths and the plan cut
// from it — traffic only one roleset can serve is charged to that roleset, and each range
// several rolesets cover is split into bands, one per roleset, in proportion to the replica
// share each still needs, at quantiles of the observed traffic. It is advisory: it names a
// roleset for a prompt length and never filters, scores or routes anything itself.
package bucketserve
