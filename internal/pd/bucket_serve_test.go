package pd_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-epp/tandem/internal/bucketserve"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/telemetry"
)

// Step 2b through the cascade: roleset A serves prompts up to 2047 tokens, B any length.
// Ten 3000-token prompts (only B covers them) make B's exclusive traffic exceed its share
// (rps: 10 of 11 requests against a target of 5.5), so once the plan is recomputed the
// shared range [0, 2047] is banded to A and short prompts go there, counted per roleset.
// With bucketServe off the planner is never consulted.
func TestBucketServeStep(t *testing.T) {
	for _, on := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		m, err := telemetry.New(reg)
		if err != nil {
			t.Fatal(err)
		}
		bs := &pd.BucketServe{}
		h := newTLWith(t, func(g *config.PD) {
			g.PromptLengthBucketing, g.BucketServe, g.BucketServeMode = true, on, "rps"
			g.PrefillScorePolicy, g.DecodeScorePolicy = pd.PolicyLeastRequest, pd.PolicyLeastRequest
		}, bs, "", "pA:prefill:A:2047", "dA:decode:A:2047", "pB:prefill:B", "dB:decode:B")
		bs.Planner = bucketserve.New(h.clock, m)
		for range 10 {
			d := h.pick(tlReq(t, "long ", 3000, nil))
			if d.Destination[0].Name != "dB" {
				t.Fatalf("a 3000-token prompt went to %s; only B covers it", d.Destination[0].Name)
			}
			d.Lifecycle.Done(nil)
		}
		h.clock.Advance(bucketserve.PlanTTL)
		for i := range 6 {
			d := h.pick(tlReq(t, "short ", 100, nil))
			if on && (d.Step != pd.StepBucketServe || d.Destination[0].Name != "dA" || d.Prefill[0].Name != "pA") {
				t.Fatalf("short prompt %d: step %q, pair %s/%s; want bucket_serve to A", i, d.Step, d.Prefill[0].Name, d.Destination[0].Name)
			}
			if !on && d.Step == pd.StepBucketServe {
				t.Fatal("bucket serving off, but step 2b decided")
			}
			// Held open: without the band, least_request would alternate between A and B.
		}
		want := map[bool]float64{true: 6, false: 0}[on]
		if got := counter(t, reg, "pd_bucket_serve_band_total", "A"); got != want {
			t.Fatalf("on=%v: pd_bucket_serve_band_total{A} = %v, want %v", on, got, want)
		}
		if on {
			// Bucketing and bands measure the prompt text (one token per 4 bytes): 94 tokens here.
			if got, pt := counter(t, reg, "pd_bucket_serve_prompt_tokens_total", "A"), tlReq(t, "short ", 100, nil).PromptTokens; got != float64(6*pt) {
				t.Fatalf("prompt tokens routed by A's band: %v", got)
			}
		}
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name, roleset string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == roleset {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestBucketServeBandsCountTokens: a band's cut inside a shared range is a boundary too. A
// prompt of "=" rules 79 wide is about 200 cl100k_base tokens in 8 KB (an estimate of 2000):
// once the plan cuts the shared range just above the short traffic (about 400 tokens), it goes
// to the short prompts' band, as counting it whole says, not to the band its estimate falls in.
func TestBucketServeBandsCountTokens(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := telemetry.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	bs := &pd.BucketServe{}
	h := newTLWith(t, func(g *config.PD) {
		g.PromptLengthBucketing, g.BucketServe, g.BucketServeMode = true, true, "rps"
		g.PrefillScorePolicy, g.DecodeScorePolicy = pd.PolicyLeastRequest, pd.PolicyLeastRequest
	}, bs, "", "pA:prefill:A", "dA:decode:A", "pB:prefill:B", "dB:decode:B")
	bs.Planner = bucketserve.New(h.clock, m)
	for range 10 {
		h.pick(tlReq(t, "short ", 400, nil)).Lifecycle.Done(nil)
		h.pick(tlReq(t, "long ", 16000, nil)).Lifecycle.Done(nil)
	}
	h.clock.Advance(bucketserve.PlanTTL)
	short := h.pick(tlReq(t, "short ", 400, nil))
	short.Lifecycle.Done(nil)
	long := h.pick(tlReq(t, "long ", 16000, nil))
	long.Lifecycle.Done(nil)
	if short.Step != pd.StepBucketServe || long.Step != pd.StepBucketServe || short.Destination[0].Name == long.Destination[0].Name {
		t.Fatalf("no plan separating short and long prompts: short %s to %s, long %s to %s (bands %v)", short.Step, short.Destination[0].Name,
			long.Step, long.Destination[0].Name, bs.Planner.Bands("m", bucketserve.ParseMode("rps"), nil))
	}
	rules := h.pick(tlReq(t, strings.Repeat("=", 79)+" ", 2000, nil))
	rules.Lifecycle.Done(nil)
	if rules.Destination[0].Name != short.Destination[0].Name {
		t.Errorf("a 200-token prompt of rules (estimate 2000) went to %s, the long prompts' band; want %s", rules.Destination[0].Name, short.Destination[0].Name)
	}
}
