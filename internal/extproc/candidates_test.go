package extproc

import (
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// testPool: pod a (10.0.0.1) serves ports 8000 and 8001, pod b (10.0.0.2) port 8000,
// pod c (fd00::3) port 8000.
func testPool() *pool.Snapshot {
	s := pool.NewStore()
	return s.Publish(pool.Info{}, []*pool.Endpoint{
		pool.NewEndpoint("ns", "a", "10.0.0.1", 8000, 0, nil, nil),
		pool.NewEndpoint("ns", "a", "10.0.0.1", 8001, 1, nil, nil),
		pool.NewEndpoint("ns", "b", "10.0.0.2", 8000, 0, nil, nil),
		pool.NewEndpoint("ns", "c", "fd00::3", 8000, 0, nil, nil),
	}, true)
}

func hostPorts(eps []*pool.Endpoint) []string {
	out := []string{}
	for _, e := range eps {
		out = append(out, e.HostPort())
	}
	return out
}

func TestSelectionFilter(t *testing.T) {
	snap := testPool()
	all := hostPorts(snap.Endpoints)
	cases := []struct {
		name string
		sel  selection
		want []string
	}{
		{"absent allows all", selection{}, all},
		{"present but empty allows none", selection{present: true}, []string{}},
		{"ip means every port of the pod", selection{present: true, entries: []string{"10.0.0.1"}}, []string{"10.0.0.1:8000", "10.0.0.1:8001"}},
		{"ip:port means that port only", selection{present: true, entries: []string{"10.0.0.1:8001"}}, []string{"10.0.0.1:8001"}},
		{"foreign ip ignored", selection{present: true, entries: []string{"192.168.9.9", "10.0.0.2"}}, []string{"10.0.0.2:8000"}},
		{"only foreign ips: none", selection{present: true, entries: []string{"192.168.9.9:8000"}}, []string{}},
		{"wrong port: none", selection{present: true, entries: []string{"10.0.0.2:9999"}}, []string{}},
		{"ipv6 bare and bracketed", selection{present: true, entries: []string{"fd00::3"}}, []string{"[fd00::3]:8000"}},
		{"ipv6 with port", selection{present: true, entries: []string{"[fd00::3]:8000"}}, []string{"[fd00::3]:8000"}},
		{"duplicates collapse, pool order kept", selection{present: true, entries: []string{"10.0.0.2", "10.0.0.1:8000", "10.0.0.2:8000"}},
			[]string{"10.0.0.1:8000", "10.0.0.2:8000"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := hostPorts(tc.sel.filter(snap)); !slices.Equal(got, tc.want) {
				t.Errorf("filter = %v, want %v", got, tc.want)
			}
		})
	}
}

func subsetMD(t *testing.T, v any) *corev3.Metadata {
	t.Helper()
	val, err := structpb.NewValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		wire.MetadataNamespaceSubset: {Fields: map[string]*structpb.Value{wire.MetadataKeySubset: val}},
	}}
}

func TestSubsetHint(t *testing.T) {
	cases := []struct {
		name string
		md   *corev3.Metadata
		want selection
	}{
		{"no metadata", nil, selection{}},
		{"other namespace only", &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {}}}, selection{}},
		{"namespace without key", &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{wire.MetadataNamespaceSubset: {}}}, selection{}},
		{"comma string", subsetMD(t, "10.0.0.1:8000, 10.0.0.2 ,,"), selection{true, []string{"10.0.0.1:8000", "10.0.0.2"}}},
		{"list", subsetMD(t, []any{"10.0.0.1", "10.0.0.2:8000"}), selection{true, []string{"10.0.0.1", "10.0.0.2:8000"}}},
		{"list of comma strings", subsetMD(t, []any{"10.0.0.1,10.0.0.2"}), selection{true, []string{"10.0.0.1", "10.0.0.2"}}},
		{"empty list is present and empty", subsetMD(t, []any{}), selection{present: true}},
		{"non-string items skipped", subsetMD(t, []any{1.0, "10.0.0.1"}), selection{true, []string{"10.0.0.1"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := subsetHint(tc.md)
			if got.present != tc.want.present || !slices.Equal(got.entries, tc.want.entries) {
				t.Errorf("subsetHint = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestServedEndpoint(t *testing.T) {
	lb := func(fields map[string]*structpb.Value) *corev3.Metadata {
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{wire.MetadataNamespaceLB: {Fields: fields}}}
	}
	cases := []struct {
		name          string
		md            *corev3.Metadata
		served, fails string
	}{
		{"reported", lb(map[string]*structpb.Value{wire.MetadataKeyServed: structpb.NewStringValue("10.0.0.1:8000")}), "10.0.0.1:8000", ""},
		{"no metadata", nil, "", "fail: missing envoy lb metadata"},
		{"no served key", lb(nil), "", "fail: missing destination endpoint served metadata"},
		{"not a string", lb(map[string]*structpb.Value{wire.MetadataKeyServed: structpb.NewNumberValue(1)}), "", "fail: missing destination endpoint served metadata"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			served, fails := servedEndpoint(tc.md)
			if served != tc.served || fails != tc.fails {
				t.Errorf("servedEndpoint = %q, %q; want %q, %q", served, fails, tc.served, tc.fails)
			}
		})
	}
}

func TestChunkedBody(t *testing.T) {
	cases := []struct {
		size  int
		eos   bool
		sizes []int
	}{
		{0, true, []int{0}},
		{1, true, []int{1}},
		{maxChunkBytes, true, []int{maxChunkBytes}},
		{maxChunkBytes + 1, true, []int{maxChunkBytes, 1}},
		{2*maxChunkBytes + 5, false, []int{maxChunkBytes, maxChunkBytes, 5}},
	}
	for _, tc := range cases {
		chunks := chunkedBody(make([]byte, tc.size), tc.eos)
		var sizes []int
		for i, c := range chunks {
			sr := c.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			sizes = append(sizes, len(sr.GetBody()))
			if want := tc.eos && i == len(chunks)-1; sr.GetEndOfStream() != want {
				t.Errorf("size %d chunk %d: end_of_stream=%v, want %v", tc.size, i, sr.GetEndOfStream(), want)
			}
		}
		if !slices.Equal(sizes, tc.sizes) {
			t.Errorf("size %d: chunks %v, want %v", tc.size, sizes, tc.sizes)
		}
	}
}

// A request reaches only the pods labelled with its model, and the unlabelled ones, when the
// pool has any, through a real ext_proc stream; a model no pod is labelled with (an adapter)
// may reach every pod.
func TestCandidatesOfTheRequestsModel(t *testing.T) {
	model := func(m string) map[string]string { return map[string]string{pool.LabelModelName: m} }
	store := pool.NewStore()
	store.Publish(pool.Info{Name: "p"}, []*pool.Endpoint{
		pool.NewEndpoint("ns", "a1", "10.0.0.1", 8000, 0, model("model-a"), nil),
		pool.NewEndpoint("ns", "b1", "10.0.0.2", 8000, 0, model("model-b"), nil),
		pool.NewEndpoint("ns", "a2", "10.0.0.3", 8000, 0, model("model-a"), nil),
		pool.NewEndpoint("ns", "u1", "10.0.0.4", 8000, 0, nil, nil), // no model label: serves whatever it is sent
	}, true)
	var seen [][]string
	sched := &stubScheduler{decide: func(_ *request.Request, cands []*pool.Endpoint) (*picker.Decision, error) {
		seen = append(seen, hostPorts(cands))
		return &picker.Decision{Strategy: "stub", Outcome: picker.OutcomeSingle, Destination: cands[:1]}, nil
	}}
	c := serve(t, NewServer(store, sched, Options{}))
	for _, m := range []string{"model-a", "model-b", "an-adapter"} {
		body := []byte(`{"model":"` + m + `","messages":[{"role":"user","content":"hi"}]}`)
		s, _, err := c.Route(testCtx(t), envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: body})
		if err != nil {
			t.Fatal(m, err)
		}
		if _, err := s.Respond(envoy.Response{Status: 200, Chunks: [][]byte{[]byte("x")}}); err != nil {
			t.Fatal(m, err)
		}
	}
	want := [][]string{{"10.0.0.1:8000", "10.0.0.3:8000", "10.0.0.4:8000"}, {"10.0.0.2:8000", "10.0.0.4:8000"},
		{"10.0.0.1:8000", "10.0.0.3:8000", "10.0.0.2:8000", "10.0.0.4:8000"}}
	if !slices.EqualFunc(seen, want, slices.Equal) {
		t.Errorf("candidates per request %v, want %v", seen, want)
	}
	// A model's view is made once per snapshot, and the snapshot owns it.
	snap := store.Load()
	if a, b := snap.OfModel("model-a"), snap.OfModel("model-a"); &a[0] != &b[0] || !snap.Owns(a) || snap.Owns(slices.Clone(a)) {
		t.Error("a model's view is not the snapshot's own, made once")
	}
	if all := snap.OfModel("an-adapter"); &all[0] != &snap.Endpoints[0] {
		t.Error("a model no pod is labelled with got a copy of the pool")
	}
}
