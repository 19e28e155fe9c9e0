package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/sim"
)

// prefillLeg is the part of a vLLM prefill leg body the tests check.
type prefillLeg struct {
	MaxTokens        int            `json:"max_tokens"`
	Stream           bool           `json:"stream"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

// checkPDRequest checks one request that went PD with the sidecar hand-off: the decode pod
// that answered got the client's request with x-prefiller-host-port naming the prefill pod of
// its own roleset, and that prefill pod received the prefill leg (do_remote_decode, 1 token).
// It returns the roleset used.
func checkPDRequest(t *testing.T, s *stack, marker string, r reply) string {
	t.Helper()
	dec := s.pods[r.pod]
	if dec == nil || dec.role != sim.RoleDecode {
		t.Fatalf("request %s answered by %q, want a decode pod: %v", marker, r.pod, r)
	}
	in := waitReceived(t, dec, marker)
	target := in.Header.Get(prefillerHeader)
	var pre *pod
	for _, p := range s.pods {
		if p.role == sim.RolePrefill && p.HostPort() == target {
			pre = p
		}
	}
	if pre == nil {
		t.Fatalf("request %s: decode pod %s got %s=%q, which is no prefill pod", marker, dec.name, prefillerHeader, target)
	}
	if pre.roleset != dec.roleset {
		t.Fatalf("request %s: decode pod %s (roleset %s) paired with prefill pod %s (roleset %s)", marker, dec.name, dec.roleset, pre.name, pre.roleset)
	}
	leg := waitReceived(t, pre, marker)
	var body prefillLeg
	if err := json.Unmarshal(leg.Body, &body); err != nil {
		t.Fatalf("prefill leg of %s on %s: %v: %s", marker, pre.name, err, leg.Body)
	}
	if body.KVTransferParams["do_remote_decode"] != true || body.MaxTokens != 1 || body.Stream {
		t.Fatalf("prefill leg of %s on %s: want kv_transfer_params.do_remote_decode=true, max_tokens=1, stream=false; got %s", marker, pre.name, leg.Body)
	}
	// No other pod saw this request.
	for _, p := range s.pods {
		if p != pre && p != dec && len(received(p, marker)) > 0 {
			t.Fatalf("request %s also reached pod %s", marker, p.name)
		}
	}
	return dec.roleset
}

// 1. The PD pair is chosen from one roleset and the prefill target reaches the decode pod
// (sidecar hand-off, Tandem's default); the decode pod's sidecar runs the prefill leg on it.
func TestPDPairAndPrefillTargetDelivered(t *testing.T) {
	s := newFileStack(t, nil, pdPods("a", "b")...)
	ctx := testCtx(t, 60*time.Second)

	cases := []struct {
		path   string
		stream bool
	}{
		{"/v1/chat/completions", false},
		{"/v1/chat/completions", true},
		{"/v1/completions", false},
		{"/v1/completions", true},
	}
	used := map[string]int{}
	for round := 0; round < 4; round++ {
		for _, tc := range cases {
			m := s.marker("pd")
			body := chatBody(prompt(m, 200), 8, tc.stream)
			if tc.path == "/v1/completions" {
				body = completionBody(prompt(m, 200), 8, tc.stream)
			}
			r := s.post(ctx, tc.path, body, nil)
			if err := okCompletion(r, tc.stream); err != nil {
				t.Fatalf("%s stream=%v: %v", tc.path, tc.stream, err)
			}
			used[checkPDRequest(t, s, m, r)]++
		}
	}
	// Each roleset can be reached: pin one request to each with a subset hint (the gateway's
	// envoy.lb.subset_hint), which Tandem must honour with a pair from inside the subset.
	for _, rs := range []string{"a", "b"} {
		m := s.marker("subset")
		hint := s.pods["prefill-"+rs].HostPort() + "," + s.pods["decode-"+rs].HostPort()
		r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 200), 8, false), map[string]string{subsetHeader: hint})
		if err := okCompletion(r, false); err != nil {
			t.Fatalf("subset %s: %v", rs, err)
		}
		if got := checkPDRequest(t, s, m, r); got != "rs-"+rs {
			t.Fatalf("subset hint %s: served by roleset %s", hint, got)
		}
	}
	t.Logf("PD requests per roleset (no hint): %v", used)
}

// With the sidecar hand-off set explicitly Tandem only names the prefill pod: a decode pod
// without the routing sidecar serves the request alone, and the prefill pod gets nothing (and
// Tandem says at start-up that this pool cannot disaggregate).
func TestSidecarHandoffLeavesThePrefillLegToThePod(t *testing.T) {
	specs := pdPods("a")
	specs[1].sidecar = false
	s := newFileStack(t, map[string]string{"TANDEM_PD_HANDOFF": "sidecar"}, specs...)
	ctx := testCtx(t, 30*time.Second)
	for i := 0; i < 4; i++ {
		m := s.marker("nosidecar")
		r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 200), 8, i%2 == 0), nil)
		if err := okCompletion(r, i%2 == 0); err != nil || r.pod != "decode-a" {
			t.Fatalf("want 200 from decode-a: %v", r)
		}
		if got := waitReceived(t, s.pods["decode-a"], m).Header.Get(prefillerHeader); got != s.pods["prefill-a"].HostPort() {
			t.Fatalf("%s = %q, want prefill-a at %s", prefillerHeader, got, s.pods["prefill-a"].HostPort())
		}
	}
	if n := countReceived(s.pods["prefill-a"]); n != 0 {
		t.Fatalf("prefill-a received %d requests; in sidecar hand-off mode Tandem must not run the prefill leg", n)
	}
}

// 2. With prompt-length bucketing, a prompt outside every PD bucket goes to the standard
// (combined) pod; prompts inside go PD. Pod annotations as in the seed's Complete Example.
func TestOutOfBucketPromptsGoToStandardPod(t *testing.T) {
	pdRange := pdConfig(`{"promptLenBucketMinLength":0,"promptLenBucketMaxLength":2048}`)
	s := newFileStack(t, map[string]string{"AIBRIX_PROMPT_LENGTH_BUCKETING": "true"},
		podSpec{name: "prefill-0", role: sim.RolePrefill, roleset: "group-0", config: pdRange},
		podSpec{name: "decode-0", role: sim.RoleDecode, roleset: "group-0", sidecar: true, config: pdRange},
		podSpec{name: "standard-0", role: sim.RoleStandard, config: pdConfig(`{"combined":true,"promptLenBucketMinLength":2048}`)},
	)
	ctx := testCtx(t, 60*time.Second)
	cases := []struct {
		tokens int
		want   string // pod that answers
	}{
		{50, "decode-0"},
		{1500, "decode-0"},
		{2000, "decode-0"},
		{2200, "standard-0"},
		{4000, "standard-0"},
		{9000, "standard-0"},
	}
	for _, tc := range cases {
		for _, stream := range []bool{false, true} {
			m := s.marker(fmt.Sprintf("len%d", tc.tokens))
			r := s.post(ctx, "/v1/chat/completions", chatBody(promptOfTokens(t, m, tc.tokens), 4, stream), nil)
			if err := okCompletion(r, stream); err != nil {
				t.Fatalf("%d tokens: %v", tc.tokens, err)
			}
			if r.pod != tc.want {
				t.Fatalf("%d-token prompt answered by %q, want %s", tc.tokens, r.pod, tc.want)
			}
			if tc.want == "standard-0" {
				in := waitReceived(t, s.pods["standard-0"], m)
				if h := in.Header.Get(prefillerHeader); h != "" {
					t.Fatalf("%d tokens: standard pod got %s=%q; a combined request has no prefill leg", tc.tokens, prefillerHeader, h)
				}
				for _, n := range []string{"prefill-0", "decode-0"} {
					if got := received(s.pods[n], m); len(got) > 0 {
						t.Fatalf("%d tokens: out-of-bucket request also reached %s", tc.tokens, n)
					}
				}
				continue
			}
			checkPDRequest(t, s, m, r)
			if got := received(s.pods["standard-0"], m); len(got) > 0 {
				t.Fatalf("%d tokens: in-bucket request also reached the standard pod", tc.tokens)
			}
		}
	}
}

// 4. Incomplete rolesets are never chosen: rs-b has only a prefill pod, rs-c only a decode
// pod; every request goes to the complete rs-a, and the two lone pods receive nothing.
func TestIncompleteRolesetIgnored(t *testing.T) {
	specs := append(pdPods("a"),
		podSpec{name: "prefill-b", role: sim.RolePrefill, roleset: "rs-b"},
		podSpec{name: "decode-c", role: sim.RoleDecode, roleset: "rs-c", sidecar: true})
	s := newFileStack(t, nil, specs...)
	ctx := testCtx(t, 60*time.Second)

	// Tandem itself sees one complete and two incomplete rolesets.
	addr := s.tandem.MetricsAddr()
	waitMetric(t, addr, "tandem_pd_rolesets", map[string]string{"state": "complete"}, func(v float64) bool { return v == 1 }, "one complete roleset")
	waitMetric(t, addr, "tandem_pd_rolesets", map[string]string{"state": "incomplete"}, func(v float64) bool { return v == 2 }, "two incomplete rolesets")

	for i := 0; i < 30; i++ {
		m := s.marker("inc")
		r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 100), 4, i%2 == 1), nil)
		if err := okCompletion(r, i%2 == 1); err != nil {
			t.Fatal(err)
		}
		if rs := checkPDRequest(t, s, m, r); rs != "rs-a" {
			t.Fatalf("request %s served by roleset %s", m, rs)
		}
	}
	for _, n := range []string{"prefill-b", "decode-c"} {
		if got := countReceived(s.pods[n]); got != 0 {
			t.Errorf("pod %s of an incomplete roleset received %d requests", n, got)
		}
	}
}

// 5. When every decode pod is gone and no combined pod exists, clients get a clear 503 with
// x-error-routing: true and an OpenAI-style JSON error, and no pod is bothered.
func TestNoDecodePodsIs503(t *testing.T) {
	s := newFileStack(t, nil, pdPods("a", "b")...)
	ctx := testCtx(t, 60*time.Second)
	m := s.marker("before")
	if r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 100), 4, false), nil); okCompletion(r, false) != nil {
		t.Fatalf("with both rolesets: %v", r)
	}

	s.pods["decode-a"].Crash()
	s.pods["decode-b"].Crash()
	s.setPool("prefill-a", "prefill-b")
	before := countReceived(s.pods["prefill-a"]) + countReceived(s.pods["prefill-b"])

	for _, stream := range []bool{false, true} {
		r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(s.marker("after"), 100), 4, stream), nil)
		if r.err != nil || r.status != http.StatusServiceUnavailable {
			t.Fatalf("no decode pods (stream=%v): want 503, got %v", stream, r)
		}
		if got := r.header.Get("x-error-routing"); got != "true" {
			t.Errorf("x-error-routing = %q, want true", got)
		}
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("Content-Type = %q, want application/json", ct)
		}
		e, err := parseErrorBody(r.body)
		if err != nil {
			t.Fatal(err)
		}
		if e.Error.Code != 503 || e.Error.Type != "service_unavailable" || !strings.Contains(e.Error.Message, "decode") || !strings.Contains(e.Error.Message, "roleset") {
			t.Errorf("error body %s: want code 503, type service_unavailable and a message about the missing decode side of the rolesets", r.body)
		}
	}
	if after := countReceived(s.pods["prefill-a"]) + countReceived(s.pods["prefill-b"]); after != before {
		t.Errorf("prefill pods received %d requests after the decode pods left", after-before)
	}
}

// With the default hand-off (auto) plain engine pods disaggregate: no decode pod declares a
// routing sidecar, so Tandem runs the prefill leg itself on the paired prefill pod and the
// decode pod gets the body with the KV transfer parameters that leg returned, and no prefill
// target header. (Before issue 13 the default was sidecar: such a decode pod recomputed every
// prompt while the prefill pods idled, silently.)
func TestDefaultHandoffDisaggregatesPlainPods(t *testing.T) {
	specs := pdPods("a")
	specs[1].sidecar = false
	s := newFileStack(t, nil, specs...)
	ctx := testCtx(t, 30*time.Second)
	for i := 0; i < 4; i++ {
		stream := i%2 == 0
		m := s.marker("auto")
		r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 200), 8, stream), nil)
		if err := okCompletion(r, stream); err != nil || r.pod != "decode-a" {
			t.Fatalf("want 200 from decode-a: %v", r)
		}
		leg := waitReceived(t, s.pods["prefill-a"], m)
		var body prefillLeg
		if err := json.Unmarshal(leg.Body, &body); err != nil || body.KVTransferParams["do_remote_decode"] != true || body.MaxTokens != 1 {
			t.Fatalf("prefill leg on prefill-a: %v %s", err, leg.Body)
		}
		dec := waitReceived(t, s.pods["decode-a"], m)
		var got struct {
			KV map[string]any `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal(dec.Body, &got); err != nil || got.KV["do_remote_prefill"] != true || dec.Header.Get(prefillerHeader) != "" {
			t.Fatalf("decode pod got %s=%q and body %.300s; want the prefill leg's KV transfer parameters and no header",
				prefillerHeader, dec.Header.Get(prefillerHeader), dec.Body)
		}
	}
}
