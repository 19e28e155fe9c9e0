// Package pool owns the set of endpoints Tandem may route to: one Endpoint per
// Ready pod × target port, with the pod's role, roleset, revision (the pair-match labels),
// engine and labels already read, held in an immutable Snapshot that sources swap atomically;
// what is derived from a whole snapshot (each model's view, the rolesets) is worked out once,
// by the snapshot, for every reader.
// It must not score or pick; sources (Kubernetes, file) live in sub-packages.
package pool
