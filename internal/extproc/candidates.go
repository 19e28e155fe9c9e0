package extproc

import (
	"net"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// selection restricts the pool to the endpoints a request may reach. The zero value (not
// present) allows every endpoint; a present selection with no entries allows none.
type selection struct {
	present bool
	entries []string // "ip" or "ip:port"; "[v6]:port" and bare v6 addresses work too
}

// splitList appends the non-empty, trimmed items of a comma-separated list.
func splitList(dst []string, s string) []string {
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			dst = append(dst, item)
		}
	}
	return dst
}

// subsetHint reads envoy.lb.subset_hint / x-gateway-destination-endpoint-subset from the
// request's metadata context. Gateways write it either as a list of strings or as one
// comma-separated string (header-to-metadata rules); both are accepted, and list items may
// themselves be comma-separated.
func subsetHint(md *corev3.Metadata) selection {
	ns := md.GetFilterMetadata()[wire.MetadataNamespaceSubset]
	if ns == nil {
		return selection{}
	}
	v, ok := ns.GetFields()[wire.MetadataKeySubset]
	if !ok {
		return selection{}
	}
	sel := selection{present: true}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		sel.entries = splitList(nil, k.StringValue)
	case *structpb.Value_ListValue:
		for _, item := range k.ListValue.GetValues() {
			if s, ok := item.GetKind().(*structpb.Value_StringValue); ok {
				sel.entries = splitList(sel.entries, s.StringValue)
			}
		}
	}
	return sel
}

// servedEndpoint reads envoy.lb / x-gateway-destination-endpoint-served from a response
// message's metadata context. The second result says why it is missing, in lwepp's words,
// for the conformance header.
func servedEndpoint(md *corev3.Metadata) (served string, missing string) {
	ns := md.GetFilterMetadata()[wire.MetadataNamespaceLB]
	if ns == nil {
		return "", "fail: missing envoy lb metadata"
	}
	v, ok := ns.GetFields()[wire.MetadataKeyServed]
	if !ok {
		return "", "fail: missing destination endpoint served metadata"
	}
	s, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return "", "fail: missing destination endpoint served metadata"
	}
	return s.StringValue, ""
}

// filter returns the snapshot's endpoints the selection allows, in snapshot order. Entries
// naming addresses outside the pool are ignored (the conformance suite sends the union of
// two pools' IPs to each pool's EPP).
func (sel selection) filter(snap *pool.Snapshot) []*pool.Endpoint {
	if !sel.present {
		return snap.Endpoints
	}
	allowed := make(map[*pool.Endpoint]bool, len(sel.entries))
	for _, entry := range sel.entries {
		if host, port, err := net.SplitHostPort(entry); err == nil {
			if e, ok := snap.ByHostPort(net.JoinHostPort(host, port)); ok {
				allowed[e] = true
			}
			continue
		}
		for _, e := range snap.ByAddress(strings.Trim(entry, "[]")) {
			allowed[e] = true
		}
	}
	out := make([]*pool.Endpoint, 0, len(allowed))
	for _, e := range snap.Endpoints {
		if allowed[e] {
			out = append(out, e)
		}
	}
	return out
}
