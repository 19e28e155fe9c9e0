package proof

import (
	"math"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/outcome"
)

func TestJudge(t *testing.T) {
	for _, c := range []struct {
		name  string
		e     Evidence
		want  Result
		basis string
	}{
		{"cached covers the prompt", Evidence{HasUsage: true, Usage: Usage{Prompt: 100, Cached: 96, Details: true}}, Verified, BasisUsage},
		{"nothing cached, the engine counts transfers", Evidence{HasUsage: true, CountsTransfers: true, Usage: Usage{Prompt: 100, Cached: 0, Details: true}}, Recomputed, BasisUsage},
		{"nothing cached, an engine not known to count transfers", Evidence{HasUsage: true, Usage: Usage{Prompt: 100, Cached: 0, Details: true}}, Unknown, BasisNone},
		{"nothing cached, not known to count transfers, late first byte", Evidence{HasUsage: true, Usage: Usage{Prompt: 100, Details: true}, DecodeFirstByte: time.Second, LocalPrefill: time.Second}, Recomputed, BasisTiming},
		{"details left out by an engine that counts transfers", Evidence{HasUsage: true, CountsTransfers: true, Usage: Usage{Prompt: 100}}, Recomputed, BasisUsage},
		{"details left out, engine not known to count transfers", Evidence{HasUsage: true, Usage: Usage{Prompt: 100}}, Unknown, BasisNone},
		{"half cached", Evidence{HasUsage: true, Usage: Usage{Prompt: 100, Cached: 50, Details: true}}, Unknown, BasisUsage},
		{"prompt too short", Evidence{HasUsage: true, Usage: Usage{Prompt: 8, Cached: 0, Details: true}}, Unknown, BasisNone},
		{"late first byte", Evidence{DecodeFirstByte: 950 * time.Millisecond, LocalPrefill: time.Second}, Recomputed, BasisTiming},
		{"early first byte", Evidence{DecodeFirstByte: 100 * time.Millisecond, LocalPrefill: time.Second, PrefillService: time.Second}, Verified, BasisTiming},
		{"early first byte, the prefill pod's model untrained", Evidence{DecodeFirstByte: 100 * time.Millisecond, LocalPrefill: time.Second}, Unknown, BasisNone},
		{"early against a leg that queued, not against a prefill", Evidence{DecodeFirstByte: 400 * time.Millisecond, LocalPrefill: 2 * time.Second, PrefillService: 500 * time.Millisecond}, Unknown, BasisNone},
		{"first byte neither early nor late", Evidence{DecodeFirstByte: 600 * time.Millisecond, LocalPrefill: time.Second, PrefillService: time.Second}, Unknown, BasisNone},
		{"late, but the decode pod had a queue", Evidence{DecodeFirstByte: 950 * time.Millisecond, LocalPrefill: time.Second, DecodeQueued: true}, Unknown, BasisNone},
		{"sidecar: later than the other decode pods by a prefill", Evidence{Sidecar: true, DecodeFirstByte: 1900 * time.Millisecond, PrefillLeg: time.Second, LocalPrefill: time.Second, HasPeers: true, PeerLate: 0}, Recomputed, BasisTiming},
		{"sidecar: late like the other decode pods (load on the prefill pod)", Evidence{Sidecar: true, DecodeFirstByte: 1900 * time.Millisecond, PrefillLeg: time.Second, LocalPrefill: time.Second, HasPeers: true, PeerLate: 0.8}, Unknown, BasisNone},
		{"sidecar: late, no other decode pod to compare with", Evidence{Sidecar: true, DecodeFirstByte: 1900 * time.Millisecond, PrefillLeg: time.Second, LocalPrefill: time.Second}, Unknown, BasisNone},
		{"sidecar: the leg predicted far too long for every pod", Evidence{Sidecar: true, DecodeFirstByte: 1200 * time.Millisecond, PrefillLeg: 3 * time.Second, LocalPrefill: time.Second, HasPeers: true, PeerLate: -2}, Unknown, BasisNone},
		{"sidecar: early never verifies", Evidence{Sidecar: true, DecodeFirstByte: 1050 * time.Millisecond, PrefillLeg: time.Second, LocalPrefill: time.Second, PrefillService: time.Second, HasPeers: true}, Unknown, BasisNone},
		{"SGLang decode pods cannot recompute", Evidence{Engine: "sglang", HasUsage: true, Usage: Usage{Prompt: 100, Details: true}}, Verified, BasisProtocol},
		{"SGLang: the prefill leg had not sent the KV", Evidence{Engine: "sglang", PrefillUnsent: true}, Unknown, BasisProtocol},
		{"TensorRT-LLM usage proves nothing", Evidence{Engine: "trtllm", HasUsage: true, Usage: Usage{Prompt: 100, Details: true}}, Unknown, BasisNone},
		{"prefill too short to tell", Evidence{DecodeFirstByte: 100 * time.Millisecond, LocalPrefill: 100 * time.Millisecond}, Unknown, BasisNone},
	} {
		if got, basis := Judge(c.e); got != c.want || basis != c.basis {
			t.Errorf("%s: Judge = %s (%s), want %s (%s)", c.name, got, basis, c.want, c.basis)
		}
	}
}

func TestScannerStream(t *testing.T) {
	body := "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":120}}}\n\n" +
		"data: [DONE]\n\n"
	var s Scanner
	for i := 0; i < len(body); i += 7 { // chunks cut anywhere
		s.Write([]byte(body[i:min(i+7, len(body))]))
	}
	u, ok := s.Usage()
	if !ok || u.Prompt != 120 || u.Cached != 120 || !u.Details || !s.Streamed() || !s.Done() {
		t.Fatalf("usage %+v %v, streamed %v, done %v", u, ok, s.Streamed(), s.Done())
	}
}

// With stream_options.continuous_usage_stats every chunk carries a usage (without the cached
// tokens): the evidence is complete at the stream's end, and it is the last usage.
func TestScannerContinuousUsage(t *testing.T) {
	var s Scanner
	s.Write([]byte("data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":1}}\n\n"))
	if s.Done() {
		t.Fatal("done at the first chunk's usage")
	}
	s.Write([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":118}}}\n\ndata: [DONE]\n\n"))
	if u, ok := s.Usage(); !s.Done() || !ok || u.Cached != 118 || !u.Details {
		t.Fatalf("done %v, usage %+v %v", s.Done(), u, ok)
	}
}

func TestScannerJSON(t *testing.T) {
	var s Scanner
	s.Write([]byte(`{"choices":[{"text":"abc"}],`))
	s.Write([]byte(`"usage":{"prompt_tokens":64,"completion_tokens":3}}`))
	u, ok := s.Usage()
	if !ok || u.Prompt != 64 || u.Details || s.Streamed() || s.Done() {
		t.Fatalf("usage %+v %v, streamed %v", u, ok, s.Streamed())
	}
	var g Scanner
	g.Write([]byte(`{"text":"x","meta_info":{"prompt_tokens":64,"cached_tokens":60}}`))
	if u, ok := g.Usage(); !ok || u.Cached != 60 || !u.Details {
		t.Fatalf("SGLang meta_info: %+v %v", u, ok)
	}
	var r Scanner // the Responses API
	r.Write([]byte(`{"id":"resp_1","object":"response","usage":{"input_tokens":300,"input_tokens_details":{"cached_tokens":296},"output_tokens":4}}`))
	if u, ok := r.Usage(); !ok || u.Prompt != 300 || u.Cached != 296 || !u.Details {
		t.Fatalf("Responses usage: %+v %v", u, ok)
	}
	var rs Scanner // streamed: the usage is the response.completed event's response's
	rs.Write([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":300,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":4}}}\n\n"))
	if u, ok := rs.Usage(); !ok || u.Prompt != 300 || u.Cached != 0 || !u.Details {
		t.Fatalf("streamed Responses usage: %+v %v", u, ok)
	}
	var m Scanner // Messages: Anthropic's input_tokens leave cached tokens out: not read
	m.Write([]byte(`{"type":"message","usage":{"input_tokens":300,"output_tokens":4}}`))
	if u, ok := m.Usage(); ok {
		t.Fatalf("Messages usage read: %+v", u)
	}
	var none Scanner
	none.Write([]byte(`{"error":{"message":"x"}}`))
	if _, ok := none.Usage(); ok {
		t.Fatal("usage found in an answer without one")
	}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func end(prefill, decode string, res Result) *outcome.Event {
	return &outcome.Event{Phase: outcome.PhaseEnd, Route: outcome.Route{Kind: outcome.KindPD, Prefill: prefill, Destination: decode, Transfer: string(res)}}
}

type counter map[string]int

func (c counter) Transfer(r Result, p, d string) { c[string(r)+" "+p+" "+d]++ }

func TestGateHoldsAndTrials(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	n := counter{}
	g := NewGate(GateOptions{Now: c.now, Observer: n, Backoff: 10 * time.Second})
	const d = "ns/decode-0:8000"
	g.Observe(end("ns/prefill-0:8000", d, Recomputed))
	if g.Held(d) {
		t.Fatal("held after one recompute")
	}
	g.Observe(end("ns/prefill-0:8000", d, Verified))
	g.Observe(end("ns/prefill-0:8000", d, Recomputed))
	if !g.Held(d) {
		t.Fatal("not held after 2 of its last 3 recomputed")
	}
	if n["recomputed ns/prefill-0 ns/decode-0"] != 2 || n["verified ns/prefill-0 ns/decode-0"] != 1 {
		t.Fatalf("counted %v", n)
	}
	g.Observe(end("ns/prefill-0:8000", d, Verified)) // picked before the hold: no trial
	c.t = c.t.Add(9 * time.Second)
	if !g.Held(d) {
		t.Fatal("released before its back-off")
	}
	c.t = c.t.Add(2 * time.Second)
	if g.Held(d) {
		t.Fatal("still held after its back-off: no trial")
	}
	g.Observe(end("ns/prefill-0:8000", d, Recomputed)) // the trial fails: held twice as long
	c.t = c.t.Add(15 * time.Second)
	if !g.Held(d) {
		t.Fatal("a failed trial should double the back-off")
	}
	c.t = c.t.Add(6 * time.Second)
	g.Observe(end("ns/prefill-0:8000", d, Unknown))
	if g.Held(d) {
		t.Fatal("held after the doubled back-off")
	}
	g.Observe(end("ns/prefill-0:8000", d, Verified))
	g.Observe(end("ns/prefill-0:8000", d, Recomputed))
	if g.Held(d) {
		t.Fatal("a verified trial should return the pod with a clean history")
	}
}

func TestGateForgetsDepartedPods(t *testing.T) {
	const gone, stays = "ns/decode-0:8000", "ns/decode-1:8000"
	inPool := map[string]bool{gone: true, stays: true}
	g := NewGate(GateOptions{InPool: func(key string) bool { return inPool[key] }})
	for _, d := range []string{gone, stays} {
		g.SawTransfer(d, "m")
		g.Record(d, Recomputed)
		g.Record(d, Recomputed)
	}
	if !g.Held(gone) || !g.Held(stays) {
		t.Fatal("setup: both pods should be held")
	}
	delete(inPool, gone)
	g.Forget(func(key string) bool { return key == stays })
	if g.Held(gone) || !g.Held(stays) {
		t.Fatalf("after forgetting: held %v (gone), %v (stays)", g.Held(gone), g.Held(stays))
	}
	g.mu.Lock()
	n := len(g.pods)
	g.mu.Unlock()
	if n != 1 {
		t.Errorf("%d pods kept, want 1", n)
	}
	// A verdict that comes after its pod left does not bring its state back.
	g.Record(gone, Recomputed)
	g.Record(gone, Recomputed)
	if g.Held(gone) {
		t.Error("a departed pod held again by late verdicts")
	}
	// A pod back in the pool under the same key (a restart) is judged from its own verdicts,
	// not from those of requests picked before its predecessor was forgotten.
	inPool[gone] = true
	before := time.Now().Add(-time.Second)
	g.RecordPicked(gone, Recomputed, before)
	g.RecordPicked(gone, Recomputed, before)
	if g.Held(gone) {
		t.Error("the restarted pod held by its predecessor's late verdicts")
	}
	g.Record(gone, Recomputed)
	g.Record(gone, Recomputed)
	if !g.Held(gone) {
		t.Error("a pod back in the pool is not judged by its verdicts")
	}
	// The model's engine still counts transfers: a new pod of it is judged by its usage.
	if !g.CountsTransfers("ns/decode-2:8000", "m") {
		t.Error("forgot that the model counts transfers")
	}
}

// Only a cached count beyond any prefix-cache hit shows an engine counting transfers.
func TestWholePrompt(t *testing.T) {
	for _, c := range []struct {
		u    Usage
		want bool
	}{
		{Usage{Prompt: 1000, Cached: 1000, Details: true}, true},
		{Usage{Prompt: 1000, Cached: 999, Details: true}, true},
		{Usage{Prompt: 1000, Cached: 992, Details: true}, false}, // 62 blocks of 16: a repeated prompt's hit
		{Usage{Prompt: 1000, Cached: 1000}, false},               // no details
		{Usage{}, false},
	} {
		if got := c.u.WholePrompt(); got != c.want {
			t.Errorf("%+v: WholePrompt %v, want %v", c.u, got, c.want)
		}
	}
}

// The peer lateness behind a sidecar: the median of the prefill pod's recent requests to other
// decode pods within the window, worked out when read; departed pods forgotten.
func TestGatePeerLate(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	g := NewGate(GateOptions{Now: c.now})
	const p, d0, d1, d2 = "ns/prefill-0:8000", "ns/decode-0:8000", "ns/decode-1:8000", "ns/decode-2:8000"
	local := time.Duration(0) // the prefill pod's time as the models know it when read
	late := func(l LegSample) (float64, bool) {
		if local == 0 {
			return 0, false
		}
		return float64(l.FirstByte-l.Wait-local) / float64(local), true
	}
	add := func(d string, firstByte time.Duration) {
		g.AddLeg(p, LegSample{Decode: d, Tokens: 1000, Wait: 0, FirstByte: firstByte})
	}
	add(d0, 2*time.Second)
	if _, ok := g.PeerLate(p, d0, late); ok {
		t.Fatal("a pod's own samples are no baseline")
	}
	add(d1, 1100*time.Millisecond)
	add(d2, 1300*time.Millisecond)
	add(d1, 1200*time.Millisecond)
	if _, ok := g.PeerLate(p, d0, late); ok {
		t.Fatal("a baseline before the prefill pod's time is known")
	}
	local = time.Second // learned since: the samples taken before count
	if got, ok := g.PeerLate(p, d0, late); !ok || math.Abs(got-0.2) > 1e-9 {
		t.Fatalf("decode-0's peers: %v %v, want the median 0.2 of 0.1, 0.3, 0.2", got, ok)
	}
	if got, ok := g.PeerLate(p, d1, late); !ok || math.Abs(got-0.65) > 1e-9 {
		t.Fatalf("decode-1's peers: %v %v, want the median 0.65 of 1.0 and 0.3", got, ok)
	}
	c.t = c.t.Add(legWindow + time.Second)
	if _, ok := g.PeerLate(p, d0, late); ok {
		t.Fatal("samples older than the window still count")
	}
	add(d1, 1100*time.Millisecond)
	add(d2, 1900*time.Millisecond)
	g.Forget(func(key string) bool { return key != d2 })
	if got, ok := g.PeerLate(p, d0, late); !ok || math.Abs(got-0.1) > 1e-9 {
		t.Fatalf("decode-0's peers once decode-2 left: %v %v, want decode-1's 0.1 alone", got, ok)
	}
}

// Whether an engine counts transferred KV as cached is known per model and revision: a new
// revision (another engine build, other flags) earns it anew.
func TestCountsTransfersPerRevision(t *testing.T) {
	g := NewGate(GateOptions{})
	a, b := EngineGroup("m", "rev=a"), EngineGroup("m", "rev=b")
	g.SawTransfer("ns/decode-0:8000", a)
	if !g.CountsTransfers("ns/decode-1:8000", a) {
		t.Error("another pod of the same revision: not known to count transfers")
	}
	if g.CountsTransfers("ns/decode-2:8000", b) || g.CountsTransfers("ns/decode-2:8000", EngineGroup("m2", "rev=a")) {
		t.Error("a pod of another revision or model taken to count transfers")
	}
	if EngineGroup("m", "") != "m" {
		t.Errorf("EngineGroup without a revision = %q, want the model", EngineGroup("m", ""))
	}
}

// A held pod's trial is one request: the first picked after the back-off; until its verdict
// comes (at most trialWait) the pod is held again. A request picked before the back-off ended
// is no trial, whenever its verdict comes.
func TestGateTrialIsOneRequest(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	g := NewGate(GateOptions{Now: c.now, Backoff: 10 * time.Second})
	const d = "ns/decode-0:8000"
	g.Record(d, Recomputed)
	g.Record(d, Recomputed)
	early := c.t.Add(5 * time.Second) // a readmitted request, picked while it was held
	c.t = c.t.Add(11 * time.Second)
	if g.Held(d) {
		t.Fatal("still held after its back-off")
	}
	g.RecordPicked(d, Verified, early)
	if g.Held(d) {
		t.Fatal("setup: an ignored verdict changed the hold")
	}
	g.TrialStarted(d)
	if !g.Held(d) {
		t.Fatal("a second request let through while the trial runs")
	}
	// A pair routed whole (a destination-only client) transferred nothing: no verdict on the trial.
	g.Observe(&outcome.Event{Phase: outcome.PhaseEnd, Route: outcome.Route{Kind: outcome.KindPD, Destination: d,
		PrefillErr: outcome.ErrPrefillNotRun, Picked: c.t}})
	if !g.Held(d) {
		t.Fatal("a pair routed whole to the held pod freed its trial")
	}
	g.TrialStarted("ns/decode-1:8000") // a pod not held: nothing
	g.Observe(&outcome.Event{Phase: outcome.PhaseEnd, Route: outcome.Route{Kind: outcome.KindPD, Destination: d, Transfer: string(Unknown), Picked: early}})
	if !g.Held(d) {
		t.Fatal("an undecided request picked before the back-off ended freed the trial")
	}
	g.Observe(&outcome.Event{Phase: outcome.PhaseEnd, Route: outcome.Route{Kind: outcome.KindPD, Destination: d, Transfer: string(Unknown), Picked: c.t}})
	if g.Held(d) {
		t.Fatal("the trial was judged unknown, and no other request may try")
	}
	g.TrialStarted(d) // the next request tries
	c.t = c.t.Add(trialWait + time.Second)
	if g.Held(d) {
		t.Fatal("the trial's verdict never came, and no other request may try")
	}
	g.TrialStarted(d)
	g.Record(d, Verified) // the second trial verifies
	if g.Held(d) {
		t.Fatal("a verified trial should return the pod")
	}
	g.TrialStarted(d) // a pod no longer held: nothing
	if g.Held(d) {
		t.Fatal("TrialStarted held a pod that is not held")
	}
}
