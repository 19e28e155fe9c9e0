package gateway

import (
	"reflect"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMutate(t *testing.T) {
	base := func() fields {
		return fields{{":path", "/v1"}, {":authority", "gw"}, {"host", "gw"}, {"a", "1"}, {"a", "2"}, {"b", "x"}}
	}
	opt := func(k, v string, f func(*corev3.HeaderValueOption)) *corev3.HeaderValueOption {
		o := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
		if f != nil {
			f(o)
		}
		return o
	}
	//lint:ignore SA1019 the deprecated field is what older EPPs send; Envoy honours it.
	appendTrue := func(o *corev3.HeaderValueOption) { o.Append = wrapperspb.Bool(true) }
	action := func(a corev3.HeaderValueOption_HeaderAppendAction) func(*corev3.HeaderValueOption) {
		return func(o *corev3.HeaderValueOption) { o.AppendAction = a }
	}
	cases := []struct {
		name string
		m    *extprocv3.HeaderMutation
		want fields
	}{
		{"set overwrites all values in place", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{opt("a", "9", nil)}},
			fields{{":path", "/v1"}, {":authority", "gw"}, {"host", "gw"}, {"a", "9"}, {"b", "x"}}},
		{"set adds a new header at the end", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{opt("C", "3", nil)}},
			append(base(), field{"c", "3"})},
		{"append=true adds a value", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{opt("b", "y", appendTrue)}},
			append(base(), field{"b", "y"})},
		{"ADD_IF_ABSENT keeps an existing header", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			opt("b", "y", action(corev3.HeaderValueOption_ADD_IF_ABSENT)), opt("d", "4", action(corev3.HeaderValueOption_ADD_IF_ABSENT))}},
			append(base(), field{"d", "4"})},
		{"OVERWRITE_IF_EXISTS skips a missing header", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			opt("d", "4", action(corev3.HeaderValueOption_OVERWRITE_IF_EXISTS))}}, base()},
		{"remove drops every value; pseudo-headers and host stay", &extprocv3.HeaderMutation{RemoveHeaders: []string{"A", ":path", "host"}},
			fields{{":path", "/v1"}, {":authority", "gw"}, {"host", "gw"}, {"b", "x"}}},
		{":path may be rewritten, :authority, host and x-envoy-* may not", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			opt(":path", "/v2", nil), opt(":authority", "evil", nil), opt("host", "evil", nil), opt("x-envoy-foo", "1", nil)}},
			fields{{":path", "/v2"}, {":authority", "gw"}, {"host", "gw"}, {"a", "1"}, {"a", "2"}, {"b", "x"}}},
		{"value used when raw_value is empty", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "b", Value: "plain"}}}},
			fields{{":path", "/v1"}, {":authority", "gw"}, {"host", "gw"}, {"a", "1"}, {"a", "2"}, {"b", "plain"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := base()
			h.mutate(c.m)
			if !reflect.DeepEqual(h, c.want) {
				t.Errorf("got  %v\nwant %v", h, c.want)
			}
		})
	}
}

func TestDestination(t *testing.T) {
	hdr := func(v string) *extprocv3.HeaderMutation {
		return &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: destinationKey, RawValue: []byte(v)}}}}
	}
	meta := func(v string) *extprocv3.ProcessingResponse {
		return (&scriptedEPP{dest: v}).decision()
	}
	cases := []struct {
		name    string
		header  *extprocv3.HeaderMutation
		md      string // "" = no metadata
		want    []string
		wantErr bool
	}{
		{"header only", hdr("10.0.0.1:8000,10.0.0.2:8000"), "", []string{"10.0.0.1:8000", "10.0.0.2:8000"}, false},
		{"metadata only", nil, "10.0.0.1:8000", []string{"10.0.0.1:8000"}, false},
		{"both agree, spacing aside", hdr("10.0.0.1:8000, 10.0.0.2:8000"), "10.0.0.1:8000,10.0.0.2:8000", []string{"10.0.0.1:8000", "10.0.0.2:8000"}, false},
		{"both disagree", hdr("10.0.0.1:8000"), "10.0.0.2:8000", nil, true},
		{"invalid entries skipped", hdr("pod-a:80,10.0.0.1:8000"), "", []string{"10.0.0.1:8000"}, false},
		{"nothing valid", hdr("pod-a:80"), "", nil, true},
		{"neither", nil, "", nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var md = meta(c.md).GetDynamicMetadata()
			if c.md == "" {
				md = nil
			}
			got, err := destination(c.header, md)
			if (err != nil) != c.wantErr || !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %v, %v; want %v (error %v)", got, err, c.want, c.wantErr)
			}
		})
	}
}
