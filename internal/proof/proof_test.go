package proof

import (
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
		{"cached against the prefill's count", Evidence{HasUsage: true, PrefillTokens: 200, Usage: Usage{Prompt: 100, Cached: 100, Details: true}}, Unknown, BasisUsage},
		{"nothing cached", Evidence{HasUsage: true, Usage: Usage{Prompt: 100, Cached: 0, Details: true}}, Recomputed, BasisUsage},
		{"details left out by a pod that reports them", Evidence{HasUsage: true, ReportsDetails: true, Usage: Usage{Prompt: 100}}, Recomputed, BasisUsage},
		{"details left out, pod never reported them", Evidence{HasUsage: true, Usage: Usage{Prompt: 100}}, Unknown, BasisNone},
		{"half cached", Evidence{HasUsage: true, Usage: Usage{Prompt: 100, Cached: 50, Details: true}}, Unknown, BasisUsage},
		{"prompt too short", Evidence{HasUsage: true, Usage: Usage{Prompt: 8, Cached: 0, Details: true}}, Unknown, BasisNone},
		{"late first byte", Evidence{DecodeFirstByte: 950 * time.Millisecond, LocalPrefill: time.Second}, Recomputed, BasisTiming},
		{"early first byte", Evidence{DecodeFirstByte: 100 * time.Millisecond, LocalPrefill: time.Second}, Unknown, BasisNone},
		{"SGLang decode pods cannot recompute", Evidence{Engine: "sglang", HasUsage: true, Usage: Usage{Prompt: 100, Details: true}}, Verified, BasisProtocol},
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
	if !ok || u.Prompt != 120 || u.Cached != 120 || !u.Details {
		t.Fatalf("usage %+v %v", u, ok)
	}
}

func TestScannerJSON(t *testing.T) {
	var s Scanner
	s.Write([]byte(`{"choices":[{"text":"abc"}],`))
	s.Write([]byte(`"usage":{"prompt_tokens":64,"completion_tokens":3}}`))
	u, ok := s.Usage()
	if !ok || u.Prompt != 64 || u.Details {
		t.Fatalf("usage %+v %v", u, ok)
	}
	var g Scanner
	g.Write([]byte(`{"text":"x","meta_info":{"prompt_tokens":64,"cached_tokens":60}}`))
	if u, ok := g.Usage(); !ok || u.Cached != 60 || !u.Details {
		t.Fatalf("SGLang meta_info: %+v %v", u, ok)
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
