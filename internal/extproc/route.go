package extproc

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/tandem-epp/tandem/internal/wire"
)

// route is what the route answer (the deferred answer to the request headers) is made of. It
// is plain data, so the answer is a pure function of it (buildRoute), tested as a table.
type route struct {
	// Destination is the decode (or only) endpoint first, then fallbacks, as ip:port.
	Destination []string
	// PrimaryOnly sends Destination[0] alone, for clients that take one host:port (the header
	// and the metadata still carry the same value, as the protocol requires).
	PrimaryOnly bool
	// Prefill is a PD decision's prefill target (ip:port), "" when there is none. It travels
	// as envoy.lb metadata in every hand-off mode, and as the sidecar's header unless EPP.
	Prefill string
	// EPP says Tandem ran the prefill leg: the decode pod must not run another one.
	EPP bool
	// SetHeaders are the decision's request headers (any case).
	SetHeaders map[string]string
	// Strip are the client control headers the request came with (lower case, sorted): they
	// are removed unless the answer sets them.
	Strip []string
	// BodyLength, when ≥ 0, is the length of a body Tandem changed (content-length is set).
	BodyLength int
	// Conformance echoes the served endpoint through the conformance suite's echo backend.
	Conformance bool
}

// buildRoute renders the route answer: the destination header and envoy.lb metadata (one
// value in both: the primary, then fallbacks unless PrimaryOnly), the prefill target (metadata
// always, the sidecar's header unless EPP), the decision's headers, content-length of a changed
// body, and the removal of client control headers. Every header overwrites a client
// value; keys are emitted in a fixed order, so equal routes give equal answers.
func buildRoute(r route) *extprocv3.ProcessingResponse {
	dest := r.Destination
	if r.PrimaryOnly && len(dest) > 1 {
		dest = dest[:1]
	}
	destination := strings.Join(dest, ",")
	set := []*corev3.HeaderValueOption{headerOption(wire.HeaderDestination, destination)}
	setKeys := map[string]bool{wire.HeaderDestination: true}
	if r.Prefill != "" && !r.EPP {
		if _, ok := r.SetHeaders[wire.HeaderPrefillerHostPort]; !ok {
			set = append(set, headerOption(wire.HeaderPrefillerHostPort, r.Prefill))
			setKeys[wire.HeaderPrefillerHostPort] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.SetHeaders)) {
		lk := strings.ToLower(k)
		switch {
		case setKeys[lk]:
			continue // the destination is the protocol's, not a strategy's, to set
		case r.EPP && lk == wire.HeaderPrefillerHostPort:
			continue // Tandem ran the prefill leg: the decode pod must not prefill again
		}
		setKeys[lk] = true
		set = append(set, headerOption(lk, r.SetHeaders[k]))
	}
	if r.BodyLength >= 0 {
		set = append(set, headerOption(wire.HeaderContentLength, strconv.Itoa(r.BodyLength)))
		setKeys[wire.HeaderContentLength] = true
	}
	if r.Conformance && len(r.Destination) > 0 {
		set = append(set, headerOption(wire.HeaderEchoSetHeader, wire.HeaderTestServed+":"+r.Destination[0]))
	}
	var remove []string
	for _, k := range r.Strip {
		if !setKeys[k] {
			remove = append(remove, k)
		}
	}
	return routeAnswer(destination, r.Prefill, set, remove)
}
