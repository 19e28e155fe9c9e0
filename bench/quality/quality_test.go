package main

import (
	"slices"
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
				t.Skipf("not registered in this tree: %v", err)
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
				t.Skipf("not registered in this tree: %v", err)
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
