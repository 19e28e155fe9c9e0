package gateway

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/testnet"
)

// wireEPP records every message a client sends, exactly, and answers each stream with what
// answer builds from the request headers; it keeps reading until the client half-closes.
type wireEPP struct {
	extprocv3.UnimplementedExternalProcessorServer
	answer func() []*extprocv3.ProcessingResponse
	mu     sync.Mutex
	msgs   [][]*extprocv3.ProcessingRequest
}

func (e *wireEPP) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	var got []*extprocv3.ProcessingRequest
	defer func() { e.mu.Lock(); e.msgs = append(e.msgs, got); e.mu.Unlock() }()
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			for _, a := range e.answer() {
				if err := s.Send(a); err != nil {
					return err
				}
			}
			return nil
		}
		if err != nil {
			return err
		}
		got = append(got, m)
	}
}

// TestShimSpeaksLikeNGINXGatewayFabric: the messages the shim sends, field by field, and what
// it keeps of the answers.
func TestShimSpeaksLikeNGINXGatewayFabric(t *testing.T) {
	up := startUpstream(t, nil)
	e := &wireEPP{answer: func() []*extprocv3.ProcessingResponse {
		route := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders:    []*corev3.HeaderValueOption{hvo("x-prefiller-host-port", "10.9.9.9:1"), hvo(destinationKey, up.addr), hvo("x-other", "1")},
					RemoveHeaders: []string{"x-client"}},
				BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(`{"replaced":true}`)}},
			}}}}
		return []*extprocv3.ProcessingResponse{route}
	}}
	eppAddr := startEPP(t, e, nil)
	gw := startGateway(t, Options{EPPAddr: eppAddr, Client: ClientNGINX, DefaultEndpoints: []string{testnet.RefusedAddr(t)},
		StripHeaders: []string{"X-Prefiller-Host-Port"}})
	req := post(t, gw+"/v1/chat/completions?x=1", `{"model":"m","messages":[]}`)
	req.Header.Set("X-Client", "c")
	req.Header.Set("X-Prefiller-Host-Port", "10.6.6.6:6")
	res := do(t, req)
	if res.status != 200 || res.body != "hello from upstream" || res.header.Get(HeaderServedBy) != up.addr {
		t.Fatalf("status %d served %q body %q", res.status, res.header.Get(HeaderServedBy), res.body)
	}
	e.mu.Lock()
	msgs := e.msgs[0]
	e.mu.Unlock()
	if len(msgs) != 2 || msgs[0].GetRequestHeaders() == nil || msgs[1].GetRequestBody() == nil {
		t.Fatalf("messages %v, want request_headers then request_body", msgs)
	}
	h := msgs[0]
	if h.GetProtocolConfig() != nil || h.GetMetadataContext() != nil || h.GetRequestHeaders().GetEndOfStream() {
		t.Errorf("headers message carries protocol config %v, metadata %v, eos %v", h.GetProtocolConfig(), h.GetMetadataContext(), h.GetRequestHeaders().GetEndOfStream())
	}
	seen := map[string]string{}
	for _, hv := range h.GetRequestHeaders().GetHeaders().GetHeaders() {
		if strings.HasPrefix(hv.GetKey(), ":") || len(hv.GetRawValue()) > 0 || hv.GetKey() != strings.ToLower(hv.GetKey()) {
			t.Errorf("header %q: a pseudo-header, raw_value or upper case", hv.GetKey())
		}
		seen[hv.GetKey()] = hv.GetValue()
	}
	host, port, _ := net.SplitHostPort(eppAddr)
	if seen["x-epp-host"] != host || seen["x-epp-port"] != port || seen["x-client"] != "c" || seen["content-type"] != "application/json" {
		t.Errorf("headers the EPP saw: %v", seen)
	}
	if b := msgs[1].GetRequestBody(); string(b.GetBody()) != `{"model":"m","messages":[]}` || !b.GetEndOfStream() {
		t.Errorf("body message %q eos %v, want the whole body at once", b.GetBody(), b.GetEndOfStream())
	}
	// Nothing of the answer but the destination: the client's body and headers reach the pod,
	// except what the route strips (nginx-side).
	hit := up.got()[0]
	if hit.body != `{"model":"m","messages":[]}` || hit.header["x-client"] != "c" || hit.header["x-other"] != "" ||
		hit.header["x-prefiller-host-port"] != "" || hit.path != "/v1/chat/completions?x=1" {
		t.Errorf("the pod got %+v", hit)
	}
}

func hvo(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
}

// TestNGINXClientWithTandem: Tandem's ext_proc server behind the NGINX client, on a pool of
// three real upstreams: it answers one host:port, which nginx can proxy to; forced to list
// fallbacks it would fail every request (nginx's "invalid port in upstream", issue 13 defect 1);
// an error answer makes nginx fail open to a pool pod.
func TestNGINXClientWithTandem(t *testing.T) {
	ups := []*upstream{startUpstream(t, nil), startUpstream(t, nil), startUpstream(t, nil)}
	store := pool.NewStore()
	var eps []*pool.Endpoint
	var addrs []string
	for i, u := range ups {
		host, port, _ := net.SplitHostPort(u.addr)
		p, _ := strconv.Atoi(port)
		eps = append(eps, pool.NewEndpoint("default", "pod-"+strconv.Itoa(i), host, int32(p), 0, nil, nil))
		addrs = append(addrs, u.addr)
	}
	store.Publish(pool.Info{Name: "pool"}, eps, true)
	for _, tc := range []struct {
		name      string
		fallbacks string
		body      string
		status    int
		fellBack  bool
	}{
		{"auto: one host:port", config.FallbacksAuto, `{"model":"m","prompt":"hello"}`, 200, false},
		{"fallbacks forced on: nginx cannot proxy the list", config.FallbacksOn, `{"model":"m","prompt":"hello"}`, 500, false},
		{"a 400 from Tandem: nginx fails open to a pool pod", config.FallbacksAuto, `{"model":"m","input":"no prompt"}`, 200, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eppAddr := startEPP(t, extproc.NewServer(store, nil, extproc.Options{Fallbacks: tc.fallbacks}), nil)
			gw := startGateway(t, Options{EPPAddr: eppAddr, Client: ClientNGINX, DefaultEndpoints: addrs})
			res := do(t, post(t, gw+"/v1/completions", tc.body))
			if res.status != tc.status || (res.header.Get(HeaderNGINXFallback) == "true") != tc.fellBack {
				t.Fatalf("status %d fallback %q error %q, want %d fallback %v", res.status, res.header.Get(HeaderNGINXFallback),
					res.header.Get("X-Gateway-Error"), tc.status, tc.fellBack)
			}
			if tc.status == 500 && !strings.Contains(res.header.Get("X-Gateway-Error"), "invalid port in upstream") {
				t.Errorf("error %q", res.header.Get("X-Gateway-Error"))
			}
		})
	}
}

// TestNGINXClientFailsOpen: an unreachable EPP, or a request without a body (the shim refuses
// it), still reaches a pool pod.
func TestNGINXClientFailsOpen(t *testing.T) {
	up := startUpstream(t, nil)
	gw := startGateway(t, Options{EPPAddr: testnet.RefusedAddr(t), Client: ClientNGINX, DefaultEndpoints: []string{up.addr}})
	res := do(t, post(t, gw+"/v1/completions", `{"model":"m","prompt":"x"}`))
	if res.status != 200 || res.header.Get(HeaderNGINXFallback) != "true" {
		t.Fatalf("unreachable EPP: status %d fallback %q", res.status, res.header.Get(HeaderNGINXFallback))
	}
	req, _ := http.NewRequest(http.MethodGet, gw+"/v1/models", nil)
	if res := do(t, req); res.status != 200 || res.header.Get(HeaderNGINXFallback) != "true" {
		t.Fatalf("no body: status %d fallback %q", res.status, res.header.Get(HeaderNGINXFallback))
	}
	if _, err := New(Options{EPPAddr: "127.0.0.1:1", Client: ClientNGINX}); err == nil || !strings.Contains(err.Error(), "DefaultEndpoints") {
		t.Errorf("NGINX client without the pool's pods: %v", err)
	}
}
