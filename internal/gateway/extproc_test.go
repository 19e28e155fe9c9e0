package gateway

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/pool"
)

// TestAgainstTandemExtproc drives Tandem's own ext_proc server (in-process, real gRPC on
// 127.0.0.1) through the gateway, with two real upstreams as the pool.
func TestAgainstTandemExtproc(t *testing.T) {
	a, b := startUpstream(t, nil), startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{"data: {\"x\":1}\n\n", "data: [DONE]\n\n"} {
			_, _ = w.Write([]byte(ev))
			_ = http.NewResponseController(w).Flush()
		}
	})
	store := pool.NewStore()
	var eps []*pool.Endpoint
	for i, u := range []*upstream{a, b} {
		host, port, _ := net.SplitHostPort(u.addr)
		p, _ := strconv.Atoi(port)
		eps = append(eps, pool.NewEndpoint("default", "pod-"+strconv.Itoa(i), host, int32(p), 0, nil, nil))
	}
	store.Publish(pool.Info{Name: "pool"}, eps, true)
	eppAddr := startEPP(t, extproc.NewServer(store, nil, extproc.Options{ConformanceMode: true}), nil)
	gw := startGateway(t, Options{EPPAddr: eppAddr})

	cases := []struct {
		name       string
		pin        string // test-epp-endpoint-selection
		body       string
		wantStatus int
		wantServed string
		wantBody   string
	}{
		{"pinned to a", a.addr, `{"model":"m","prompt":"hello"}`, 200, a.addr, "hello from upstream"},
		{"pinned to b, streamed", b.addr, `{"model":"m","prompt":"hello","stream":true}`, 200, b.addr, "data: {\"x\":1}\n\ndata: [DONE]\n\n"},
		{"no model: 400 from the EPP", a.addr, `{"prompt":"hello"}`, 400, "", ""},
		{"pin outside the pool: 503", "10.9.9.9", `{"model":"m","prompt":"hello"}`, 503, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := post(t, gw+"/v1/completions", c.body)
			req.Header.Set("test-epp-endpoint-selection", c.pin)
			res := do(t, req)
			if res.status != c.wantStatus || res.err != nil {
				t.Fatalf("status %d err %v body %q, want %d", res.status, res.err, res.body, c.wantStatus)
			}
			if c.wantServed == "" {
				return
			}
			if got := res.header.Get("x-conformance-test-served-endpoint"); got != c.wantServed {
				t.Errorf("served endpoint echoed by the EPP = %q, want %q", got, c.wantServed)
			}
			if res.body != c.wantBody {
				t.Errorf("body %q, want %q", res.body, c.wantBody)
			}
		})
	}
	// Without a pin, the EPP picks one of the two.
	res := do(t, post(t, gw+"/v1/completions", `{"model":"m","prompt":"hello"}`))
	if s := res.header.Get("x-conformance-test-served-endpoint"); res.status != 200 || !strings.Contains(a.addr+" "+b.addr, s) || s == "" {
		t.Errorf("unpinned: status %d served %q", res.status, s)
	}
}
