package gateway

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/structpb"
)

// requestFields renders a client request as Envoy hands it to ext_proc: pseudo-headers first
// (`:authority`, `:path`, `:method`, `:scheme`), then the headers lower-cased, plus the
// x-request-id and x-forwarded-proto Envoy's connection manager adds.
func requestFields(r *http.Request) fields {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	h := fields{{":authority", r.Host}, {":path", r.URL.RequestURI()}, {":method", r.Method}, {":scheme", scheme}}
	h = fromHTTP(h, sortedHeader(r.Header))
	if _, ok := h.get("x-request-id"); !ok {
		h.add("x-request-id", uuid.NewString())
	}
	h.set("x-forwarded-proto", scheme)
	return h
}

func responseFields(resp *http.Response) fields {
	h := fields{{":status", strconv.Itoa(resp.StatusCode)}}
	return fromHTTP(h, sortedHeader(resp.Header))
}

// sortedHeader returns h with keys in a stable order (a map has none), so the EPP sees the
// same header order for the same request.
func sortedHeader(h http.Header) http.Header {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(http.Header, len(h))
	for _, k := range keys {
		out[k] = h[k]
	}
	return out
}

func headersMsg(request bool, h fields, eos bool, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	hh := &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: eos}
	m := &extprocv3.ProcessingRequest{MetadataContext: md}
	if request {
		m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: hh}
	} else {
		m.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}
	}
	return m
}

func bodyMsg(request bool, chunk []byte, eos bool) *extprocv3.ProcessingRequest {
	b := &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: b}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: b}}
}

func trailersMsg(request bool, t http.Header) *extprocv3.ProcessingRequest {
	tt := &extprocv3.HttpTrailers{Trailers: fromHTTP(nil, sortedHeader(t)).proto()}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: tt}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: tt}}
}

func metadata(namespace, key string, v *structpb.Value) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		namespace: {Fields: map[string]*structpb.Value{key: v}},
	}}
}

func subsetMetadata(list []string) *corev3.Metadata {
	vals := make([]*structpb.Value, len(list))
	for i, s := range list {
		vals[i] = structpb.NewStringValue(s)
	}
	return metadata(subsetNamespace, subsetKey, structpb.NewListValue(&structpb.ListValue{Values: vals}))
}

func servedMetadata(endpoint string) *corev3.Metadata {
	return metadata(destinationNamespace, servedKey, structpb.NewStringValue(endpoint))
}

// destination reads the EPP's pick from the request-headers answer: the header it sets and
// the envoy.lb dynamic metadata. Either suffices; when both are present they must agree.
func destination(m *extprocv3.HeaderMutation, md *structpb.Struct) ([]string, error) {
	hv, hasHeader := setValue(m, destinationKey)
	mv, hasMeta, err := metadataDestination(md)
	if err != nil {
		return nil, err
	}
	var fromHeader, fromMeta []string
	if hasHeader {
		if fromHeader, err = parseDestinations(hv); err != nil {
			return nil, fmt.Errorf("header %s: %w", destinationKey, err)
		}
	}
	if hasMeta {
		if fromMeta, err = parseDestinations(mv); err != nil {
			return nil, fmt.Errorf("metadata %s/%s: %w", destinationNamespace, destinationKey, err)
		}
	}
	if hasHeader && hasMeta && !slices.Equal(fromHeader, fromMeta) {
		return nil, fmt.Errorf("EPP disagrees with itself: header %s=%q but metadata %s/%s=%q; they must name the same endpoints",
			destinationKey, hv, destinationNamespace, destinationKey, mv)
	}
	if hasHeader {
		return fromHeader, nil
	}
	return fromMeta, nil
}

func metadataDestination(md *structpb.Struct) (string, bool, error) {
	ns := md.GetFields()[destinationNamespace].GetStructValue()
	v, ok := ns.GetFields()[destinationKey]
	if !ok {
		return "", false, nil
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue, true, nil
	case *structpb.Value_ListValue:
		parts := make([]string, 0, len(k.ListValue.GetValues()))
		for _, e := range k.ListValue.GetValues() {
			parts = append(parts, e.GetStringValue())
		}
		return strings.Join(parts, ","), true, nil
	}
	return "", false, fmt.Errorf("metadata %s/%s is a %T, want a string \"ip:port[,ip:port]\"", destinationNamespace, destinationKey, v.GetKind())
}

// streamed returns the FULL_DUPLEX_STREAMED chunk of a body answer; nil means the EPP sent a
// plain body answer, which Envoy rejects as spurious in this mode.
func streamed(b *extprocv3.BodyResponse) *extprocv3.StreamedBodyResponse {
	return b.GetResponse().GetBodyMutation().GetStreamedResponse()
}

// kind names a ProcessingResponse's oneof for error messages.
func kind(m *extprocv3.ProcessingResponse) string {
	s := fmt.Sprintf("%T", m.GetResponse())
	if _, after, ok := strings.Cut(s, "ProcessingResponse_"); ok {
		return after
	}
	return s
}

// withValues returns the trailers that carry a value (net/http pre-declares keys as nil).
func withValues(t http.Header) http.Header {
	var out http.Header
	for k, v := range t {
		if len(v) > 0 {
			if out == nil {
				out = make(http.Header)
			}
			out[k] = v
		}
	}
	return out
}
