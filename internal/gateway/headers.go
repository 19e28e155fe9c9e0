package gateway

import (
	"net/http"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// field is one header line, key lower-cased as Envoy hands headers to ext_proc.
type field struct{ key, value string }

// fields is an ordered header map that keeps repeated keys and pseudo-headers, the shape
// Envoy's HeaderMap has.
type fields []field

func (h fields) get(key string) (string, bool) {
	for _, f := range h {
		if f.key == key {
			return f.value, true
		}
	}
	return "", false
}

func (h *fields) del(key string) {
	out := (*h)[:0]
	for _, f := range *h {
		if f.key != key {
			out = append(out, f)
		}
	}
	*h = out
}

// set overwrites key at its first position and drops its other values.
func (h *fields) set(key, value string) {
	out := (*h)[:0]
	done := false
	for _, f := range *h {
		if f.key == key {
			if done {
				continue
			}
			f.value, done = value, true
		}
		out = append(out, f)
	}
	if !done {
		out = append(out, field{key, value})
	}
	*h = out
}

func (h *fields) add(key, value string) { *h = append(*h, field{key, value}) }

func (h fields) proto() *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(h))}
	for _, f := range h {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: f.key, RawValue: []byte(f.value)})
	}
	return m
}

// hopByHop are connection-scoped headers a proxy never forwards (RFC 9110 §7.6.1).
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true,
	"transfer-encoding": true, "upgrade": true, "proxy-authenticate": true, "proxy-authorization": true,
	"trailer": true,
}

// httpHeader converts to net/http form, leaving out pseudo-headers, hop-by-hop headers and
// "host" (carried by Request.Host).
func (h fields) httpHeader() http.Header {
	out := make(http.Header, len(h))
	for _, f := range h {
		if strings.HasPrefix(f.key, ":") || hopByHop[f.key] || f.key == "host" {
			continue
		}
		out.Add(f.key, f.value)
	}
	return out
}

func fromHTTP(dst fields, h http.Header) fields {
	for k, vs := range h {
		k = strings.ToLower(k)
		for _, v := range vs {
			dst = append(dst, field{k, v})
		}
	}
	return dst
}

// frozen lists headers an ext_proc server may not set (Envoy ignores the attempt).
func frozen(key string) bool {
	switch key {
	case ":method", ":authority", ":scheme", "host":
		return true
	}
	return strings.HasPrefix(key, "x-envoy")
}

// mutate applies an ext_proc HeaderMutation the way Envoy's ext_proc filter does: removals
// first (never pseudo-headers or host), then sets; a set overwrites unless it asks to append
// (the `append` field defaults to false in this message).
func (h *fields) mutate(m *extprocv3.HeaderMutation) {
	if m == nil {
		return
	}
	for _, k := range m.GetRemoveHeaders() {
		k = strings.ToLower(k)
		if strings.HasPrefix(k, ":") || k == "host" {
			continue
		}
		h.del(k)
	}
	for _, o := range m.GetSetHeaders() {
		hv := o.GetHeader()
		if hv == nil {
			continue
		}
		key := strings.ToLower(hv.GetKey())
		if key == "" || frozen(key) {
			continue
		}
		value := string(hv.GetRawValue())
		if len(hv.GetRawValue()) == 0 {
			value = hv.GetValue()
		}
		_, exists := h.get(key)
		switch action(o) {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h.add(key, value)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h.add(key, value)
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h.set(key, value)
			}
		default:
			h.set(key, value)
		}
	}
}

// action reads the append semantics of one set: the legacy `append` wrapper wins when
// present; otherwise a non-default append_action; otherwise overwrite.
func action(o *corev3.HeaderValueOption) corev3.HeaderValueOption_HeaderAppendAction {
	//lint:ignore SA1019 Envoy still honours the deprecated field, and EPPs still send it.
	if a := o.GetAppend(); a != nil {
		if a.GetValue() {
			return corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
		}
		return corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
	}
	if a := o.GetAppendAction(); a != corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD {
		return a
	}
	return corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
}

// setValue returns the value the mutation sets for key, if it sets one.
func setValue(m *extprocv3.HeaderMutation, key string) (string, bool) {
	var v string
	var ok bool
	for _, o := range m.GetSetHeaders() {
		hv := o.GetHeader()
		if strings.EqualFold(hv.GetKey(), key) {
			v, ok = string(hv.GetRawValue()), true
			if len(hv.GetRawValue()) == 0 {
				v = hv.GetValue()
			}
		}
	}
	return v, ok
}
