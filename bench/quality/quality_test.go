package main

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/sim"
)

// tinyWorkload is the first n requests of a trace, offered at rate req/s.
func tinyWorkload(t *testing.T, name string, n int) *workload {
	t.Helper()
	dir, err := findData("")
	if err != nil {
		t.Skipf("traces not available: %v", err)
	}
	w, err := loadWorkload(dir, name, n, sim.DefaultParams(), 7)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func runTiny(t *testing.T, w *workload, pol policy, rate float64) *runResult {
	t.Helper()
	c, err := parseCluster("2x1p1d+1s")
	if err != nil {
		t.Fatal(err)
	}
	mult := (float64(len(w.reqs)-1) / w.span) / rate
	res, err := simulate(w, c, pol, runOpts{params: sim.DefaultParams(), scrape: 1, seed: 7, timeMult: mult})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func byName(t *testing.T, name string) policy {
	i := slices.IndexFunc(allPolicies, func(p policy) bool { return p.name == name })
	if i < 0 {
		t.Fatalf("no policy %q", name)
	}
	return allPolicies[i]
}

// Sanity, for every policy the tree registers: every request completes with all its
// tokens, TTFT is at least the request's own prefill compute, and the first token comes
// before the last.
func TestEveryRequestCompletes(t *testing.T) {
	w := tinyWorkload(t, "mooncake", 40) // shared prefixes, long prompts
	p := sim.DefaultParams()
	for _, pol := range allPolicies {
		t.Run(pol.name, func(t *testing.T) {
			c, _ := parseCluster("2x1p1d+1s")
			mult := (float64(len(w.reqs)-1) / w.span) / 1.0
			res, err := simulate(w, c, pol, runOpts{params: p, scrape: 1, seed: 7, timeMult: mult})
			if _, ok := err.(errNotRegistered); ok {
				t.Fatalf("policy not registered: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res.recs {
				if r.failed != "" {
					t.Fatalf("request %d failed: %s", i, r.failed)
				}
				if r.prefillC <= 0 || r.ttft() < r.prefillC-1e-9 {
					t.Fatalf("request %d: TTFT %.6f s < its prefill compute %.6f s", i, r.ttft(), r.prefillC)
				}
				if r.done < r.first || r.first < r.arrive {
					t.Fatalf("request %d: arrive %.6f first %.6f done %.6f out of order", i, r.arrive, r.first, r.done)
				}
			}
		})
	}
}

// An idle pod's TTFT is exactly its prefill time (plain) and E2E adds out−1 steps at a
// batch of one: checkable by hand from internal/sim's model.
func TestIdlePodMatchesModel(t *testing.T) {
	w := tinyWorkload(t, "code", 3)
	p := sim.DefaultParams()
	// Spread the three requests 1000 s apart so each finds an idle pod.
	for i := range w.reqs {
		w.reqs[i].at = float64(i) * 1000
	}
	w.span = 2000
	res := runTiny(t, w, byName(t, "round-robin"), float64(len(w.reqs)-1)/w.span)
	for i, r := range res.recs {
		q := w.reqs[i]
		wantTTFT := sim.PrefillSeconds(p, q.prompt)
		wantE2E := wantTTFT + float64(q.out-1)*sim.InterTokenSeconds(p, 1)
		if d := r.ttft() - wantTTFT; d > 1e-9 || d < -1e-9 {
			t.Errorf("request %d (%d prompt tokens): TTFT %.9f, want PrefillSeconds %.9f", i, q.prompt, r.ttft(), wantTTFT)
		}
		if d := r.e2e() - wantE2E; d > 1e-6 || d < -1e-6 {
			t.Errorf("request %d: E2E %.9f, want %.9f", i, r.e2e(), wantE2E)
		}
	}
}

// The same seed gives the same numbers, for every policy: the bench's own randomness
// (prompt text) and every random choice of the picker (picker.Deps.Rand) come from the seed.
func TestDeterministicForASeed(t *testing.T) {
	w := tinyWorkload(t, "mix", 150)
	for _, pol := range allPolicies {
		t.Run(pol.name, func(t *testing.T) {
			c, _ := parseCluster("2x1p1d+1s")
			o := runOpts{params: sim.DefaultParams(), scrape: 1, seed: 7, timeMult: 0.3}
			a, err := simulate(w, c, pol, o)
			if _, ok := err.(errNotRegistered); ok {
				t.Fatalf("policy not registered: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := simulate(w, c, pol, o)
			if err != nil {
				t.Fatal(err)
			}
			for i := range a.recs {
				if a.recs[i] != b.recs[i] {
					t.Fatalf("request %d differs between two runs with one seed: %+v vs %+v", i, a.recs[i], b.recs[i])
				}
			}
			sa, _ := summarize(a, sim.DefaultParams())
			sb, _ := summarize(b, sim.DefaultParams())
			if sa != sb {
				t.Fatalf("summaries differ: %+v vs %+v", sa, sb)
			}
		})
	}
	// Prompt text, and so the prefix sharing, depends on the seed only.
	dir, _ := findData("")
	w2, err := loadWorkload(dir, "conv", 5, sim.DefaultParams(), 7)
	if err != nil {
		t.Fatal(err)
	}
	for i := range w2.reqs {
		if string(w2.reqs[i].body) != string(w.reqs[i].body) {
			t.Fatalf("request %d body differs for one seed", i)
		}
	}
}

// Mooncake requests that share leading hash ids share a real text prefix, so the engine
// sees whole shared blocks; Azure requests share nothing.
func TestPrefixSharingFollowsTheTrace(t *testing.T) {
	w := tinyWorkload(t, "mooncake", 200)
	shared := 0
	for i := 1; i < len(w.reqs); i++ {
		for j := 0; j < i; j++ {
			a, b := w.reqs[i].ids, w.reqs[j].ids
			if len(a) > 1 && len(b) > 1 && a[0] == b[0] {
				// one 512-token trace block = 32 engine blocks of 16 tokens
				n := min(len(w.reqs[i].hashes), len(w.reqs[j].hashes), 32)
				if !slices.Equal(w.reqs[i].hashes[:n], w.reqs[j].hashes[:n]) {
					t.Fatalf("requests %d and %d share hash id %d but not their first %d engine blocks", j, i, a[0], n)
				}
				shared++
				break
			}
		}
	}
	if shared == 0 {
		t.Fatal("no request in the first 200 shares a first block: the check checked nothing")
	}
	az := tinyWorkload(t, "conv", 20)
	if slices.Equal(az.reqs[0].hashes[:1], az.reqs[1].hashes[:1]) {
		t.Fatal("two Azure prompts share a first block")
	}
}

// The virtual engine's prefill–decode interference, worked by hand. Model: no prefill base
// or attention term, 0.0001 s per prompt token, 1000-token chunks, decode step 0.01 s.
// A (100 prompt tokens, 4 out) arrives at 0 on an idle combined pod: prefill 0.01, first
// token at 0.01, second at 0.02. B (2500 prompt tokens, 1 out) arrives at 0.015 and
// prefills in chunks of 1000, 1000, 500 tokens (0.1, 0.1, 0.05 s), each iteration also
// carrying A's decode step: ends at 0.125, 0.235, 0.295, so B's TTFT is 0.28 (0.25 alone).
// A's step starting at 0.02 rides B's first chunk: 0.01 + 0.1, third token at 0.13; the
// next rides the second chunk: fourth token at 0.24 (0.04 alone). B's third chunk starts at
// 0.235, while A still decodes.
func TestPrefillStallsDecodeOnCombinedPod(t *testing.T) {
	p := sim.DefaultParams()
	p.PrefillBase, p.PrefillPerToken, p.PrefillQuadratic = 0, 0.0001, 0
	p.DecodeBase, p.DecodePerSeq, p.PrefillChunkTokens = 0.01, 0, 1000
	c, _ := parseCluster("1x1p1d+1s")
	var std *vpod
	d := newDES()
	for _, e := range c.endpoints(false) {
		if strings.HasPrefix(e.Name, "standard-") {
			std = newPod(d, e, p)
		}
	}
	a := &wreq{id: 1, prompt: 100, out: 4}
	b := &wreq{id: 2, at: 0.015, prompt: 2500, out: 1}
	var ra, rb record
	fin := 0
	d.at(0, func() { ra.arrive = 0; runPlain(d, a, &ra, std, nil, func() { fin++ }) })
	d.at(0.015, func() { rb.arrive = 0.015; runPlain(d, b, &rb, std, nil, func() { fin++ }) })
	d.run()
	if fin != 2 {
		t.Fatalf("%d of 2 requests finished", fin)
	}
	near := func(got, want float64) bool { return got-want < 1e-9 && want-got < 1e-9 }
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"A first token", ra.first, 0.01},
		{"A done", ra.done, 0.24},
		{"B TTFT", rb.ttft(), 0.28},
		{"B own prefill compute", rb.prefillC, 0.25},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s = %.9f, want %.9f", c.what, c.got, c.want)
		}
	}
	// What a scrape sees while B is queued behind another prefill: vLLM's waiting count.
	d2 := newDES()
	v := newPod(d2, std.ep, p)
	var seen [2]float64
	d2.at(0, func() {
		v.admit(1000, func() { v.lane(func() {}) }) // holds the lane, never releases it
		v.admit(1000, func() { v.lane(func() {}) }) // admitted, queued for the lane
	})
	d2.at(1, func() { s := v.sample(); seen = [2]float64{s.Running, s.Waiting} })
	d2.run()
	if seen != [2]float64{1, 1} {
		t.Fatalf("running, waiting = %v, want [1 1]: a request queued for the prefill lane counts as waiting", seen)
	}
}

// The report names the command that produced it, without this machine's paths.
func TestReportArgsDropPaths(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"-clusters 2x3p1d+2s -docs docs/quality", "-clusters 2x3p1d+2s -docs docs/quality"},
		{"-out /tmp/x -clusters 1x8p8d", "-clusters 1x8p8d"},
		{"--data=/somewhere/data -loads 0.8 -out=/tmp/y", "-loads 0.8"},
	} {
		if got := reportArgs(strings.Fields(c.in)); got != c.want {
			t.Errorf("reportArgs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if _, err := parseFlags([]string{"-validate-scale", "0"}, io.Discard); err == nil || !strings.Contains(err.Error(), "-validate-scale") {
		t.Errorf("-validate-scale 0: error %v, want one naming -validate-scale", err)
	}
}
