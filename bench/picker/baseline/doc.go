// Package baseline is a frozen copy of the PD cascade as it was before it became a plugin
// chain (internal/pd at commit 6ceecbe: cascade.go, select.go, rolesets.go, policies.go,
// trackers.go, unchanged but for the package name). It exists only so bench/picker can time
// today's chain against it side by side in one run, and so the equivalence test can check
// that the chain decides exactly as the cascade did. It is not part of Tandem: nothing but
// bench/picker may import it, and it must not be edited except to keep it compiling.
package baseline
