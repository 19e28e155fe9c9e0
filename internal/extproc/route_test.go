package extproc

import (
	"slices"
	"strconv"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// TestBuildRoute: the route answer is a pure function of the route. Each case names the headers
// set (in order), the headers removed and the envoy.lb metadata.
func TestBuildRoute(t *testing.T) {
	type want struct {
		set    []string // "key=value", in order
		remove []string
		lb     map[string]string
	}
	dest := []string{"10.0.0.2:8000", "10.0.0.3:8000"}
	cases := []struct {
		name string
		r    route
		want want
	}{
		{"single pod, body as sent", route{Destination: dest[:1], BodyLength: -1},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000"}}},
		{"fallbacks and a strategy's headers, in the order of its keys, lower-cased", route{Destination: dest, BodyLength: -1,
			SetHeaders: map[string]string{"X-B": "2", "x-a": "1"}},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000,10.0.0.3:8000", "x-b=2", "x-a=1"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000,10.0.0.3:8000"}}},
		{"a strategy cannot set the destination", route{Destination: dest[:1], BodyLength: -1,
			SetHeaders: map[string]string{"X-Gateway-Destination-Endpoint": "10.9.9.9:1"}},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000"}}},
		{"sidecar hand-off: prefill target in header and metadata", route{Destination: dest[:1], Prefill: "10.0.0.1:8000", BodyLength: -1},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000", "x-prefiller-host-port=10.0.0.1:8000"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000", "x-prefiller-host-port": "10.0.0.1:8000"}}},
		{"sidecar hand-off, the strategy names the target", route{Destination: dest[:1], Prefill: "10.0.0.1:8000", BodyLength: -1,
			SetHeaders: map[string]string{wire.HeaderPrefillerHostPort: "10.0.0.1:8000"}},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000", "x-prefiller-host-port=10.0.0.1:8000"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000", "x-prefiller-host-port": "10.0.0.1:8000"}}},
		{"epp hand-off: no prefill target for the decode pod, new body length", route{Destination: dest[:1], EPP: true, BodyLength: 42,
			SetHeaders: map[string]string{wire.HeaderPrefillerHostPort: "10.0.0.1:8000"}},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000", "content-length=42"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000"}}},
		{"epp hand-off: the prefill target travels as metadata only", route{Destination: dest[:1], Prefill: "10.0.0.1:8000", EPP: true, BodyLength: 42},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000", "content-length=42"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000", "x-prefiller-host-port": "10.0.0.1:8000"}}},
		{"primary only: header and metadata carry the same single host:port", route{Destination: dest, PrimaryOnly: true, BodyLength: -1},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000"}}},
		{"client control headers removed unless set", route{Destination: dest[:1], Prefill: "10.0.0.1:8000", BodyLength: -1,
			Strip: []string{"x-data-parallel-host-port", "x-gateway-destination-endpoint", "x-gateway-destination-endpoint-subset", "x-prefiller-host-port"}},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000", "x-prefiller-host-port=10.0.0.1:8000"},
				remove: []string{"x-data-parallel-host-port", "x-gateway-destination-endpoint-subset"},
				lb:     map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000", "x-prefiller-host-port": "10.0.0.1:8000"}}},
		{"conformance echo of the served endpoint", route{Destination: dest, BodyLength: -1, Conformance: true},
			want{set: []string{"x-gateway-destination-endpoint=10.0.0.2:8000,10.0.0.3:8000", "x-echo-set-header=x-conformance-test-served-endpoint:10.0.0.2:8000"},
				lb: map[string]string{"x-gateway-destination-endpoint": "10.0.0.2:8000,10.0.0.3:8000"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := buildRoute(tc.r)
			cr := got.GetRequestHeaders().GetResponse()
			if !cr.GetClearRouteCache() {
				t.Error("the route cache must be cleared: the destination changed")
			}
			var set []string
			for _, h := range cr.GetHeaderMutation().GetSetHeaders() {
				set = append(set, h.GetHeader().GetKey()+"="+string(h.GetHeader().GetRawValue()))
				if h.GetAppendAction() != 2 { // OVERWRITE_IF_EXISTS_OR_ADD
					t.Errorf("%s appends to a client value", h.GetHeader().GetKey())
				}
			}
			lb := map[string]string{}
			for k, v := range got.GetDynamicMetadata().GetFields()[wire.MetadataNamespaceLB].GetStructValue().GetFields() {
				lb[k] = v.GetStringValue()
			}
			if !slices.Equal(set, tc.want.set) || !slices.Equal(cr.GetHeaderMutation().GetRemoveHeaders(), tc.want.remove) || len(lb) != len(tc.want.lb) {
				t.Fatalf("set %q remove %q lb %v; want %q %q %v", set, cr.GetHeaderMutation().GetRemoveHeaders(), lb, tc.want.set, tc.want.remove, tc.want.lb)
			}
			for k, v := range tc.want.lb {
				if lb[k] != v {
					t.Errorf("envoy.lb %s = %q, want %q", k, lb[k], v)
				}
			}
			a, _ := protojson.Marshal(got)
			b, _ := protojson.Marshal(buildRoute(tc.r))
			if string(a) != string(b) {
				t.Error("the same route gave two different answers")
			}
		})
	}
}

// TestClientPDControlFieldsNeverReachAPod: whatever the strategy, the body the gateway
// forwards has no client-sent kv_transfer_params (or the other control fields) and its
// content-length is the new one; the sidecar's other target headers are removed too. With
// TrustClientPDFields the body goes as it came. (Issue 11, defect 3: with routing-strategy
// random the client's remote_host went to the decode pod unchanged.)
func TestClientPDControlFieldsNeverReachAPod(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.9.9.9","remote_port":4444},"bootstrap_host":"10.9.9.9"}`
	want := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	req := envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(body),
		Headers: envoy.Headers("routing-strategy", "random", wire.HeaderEncoderHostsPorts, "10.9.9.9:1", wire.HeaderDataParallelHostPort, "10.9.9.9:2")}
	for _, trust := range []bool{false, true} {
		obs := newRecObserver()
		c := serve(t, NewServer(twoPods(), nil, Options{Observer: obs, TrustClientPDFields: trust}))
		_, r, err := c.Route(testCtx(t), req)
		if err != nil || r.Immediate != nil {
			t.Fatalf("route: %v %+v", err, r)
		}
		for _, h := range []string{wire.HeaderEncoderHostsPorts, wire.HeaderDataParallelHostPort} {
			if !slices.Contains(r.Headers.Remove, h) {
				t.Errorf("client-sent %s is not removed (remove %q)", h, r.Headers.Remove)
			}
		}
		if trust {
			if string(r.Body) != body || r.Headers.Set["content-length"] != "" {
				t.Errorf("trusted: body %s, content-length %q; want it as sent", r.Body, r.Headers.Set["content-length"])
			}
			continue
		}
		if string(r.Body) != want || r.Headers.Set["content-length"] != strconv.Itoa(len(want)) {
			t.Errorf("forwarded body %s, content-length %q; want %s, %d", r.Body, r.Headers.Set["content-length"], want, len(want))
		}
		obs.mu.Lock()
		if !slices.Equal(obs.removed, []string{"bootstrap_host", "kv_transfer_params"}) {
			t.Errorf("fields removed reported: %q", obs.removed)
		}
		obs.mu.Unlock()
	}
}

// TestReadHeadersAreTheConfiguredOnes: request.ReadHeaders must list the headers the resolver
// reads.
func TestReadHeadersAreTheConfiguredOnes(t *testing.T) {
	for _, h := range []string{wire.HeaderRoutingStrategy, wire.HeaderConfigProfile, request.HeaderSessionKey} {
		if !slices.Contains(request.ReadHeaders, h) {
			t.Errorf("request.ReadHeaders lacks %s: its value would reach labels and logs unchecked", h)
		}
	}
}
