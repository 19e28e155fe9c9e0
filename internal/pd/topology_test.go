package pd

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// in places a test pod on its own node in a zone (no NVLink domain): pairs in one zone are
// at distance 2 under the default labels (node, clique, zone), pairs across zones at 3.
func in(p pod, zone string) pod {
	p.labels = map[string]string{config.LabelHostname: "node-" + p.name, config.LabelZone: zone}
	return p
}

func pairDistanceStep(d *picker.Decision) string {
	if d.Trace == nil {
		return ""
	}
	i := slices.IndexFunc(d.Trace.Steps, func(s string) bool { return strings.HasPrefix(s, StepPairDistance+":") })
	if i < 0 {
		return ""
	}
	return d.Trace.Steps[i]
}

// Two prefill and two decode pods of one roleset, one of each in each zone, all idle: every
// pair costs the same under the seed's policies, so the pair step picks among four equal
// pairs. With topology the pair is always in one zone; without it, half the picks cross.
func TestTopologyNearestPairAmongTies(t *testing.T) {
	pods := []pod{in(P("pA0", "A"), "a"), in(P("pA1", "A"), "b"), in(D("dA0", "A"), "b"), in(D("dA1", "A"), "a")}
	zone := func(h *harness, d *picker.Decision) (string, string) {
		return h.byName[d.Prefill[0].Name].Labels[config.LabelZone], h.byName[d.Destination[0].Name].Labels[config.LabelZone]
	}
	for _, tc := range []struct {
		name     string
		topology config.TopologyLabels
		minCross int
		maxCross int
	}{
		{"topology-aware", config.DefaultTopologyLabels(), 0, 0},
		{"topology-blind", config.TopologyLabels{}, 5, 35}, // 40 picks, each crossing at p=1/2
	} {
		t.Run(tc.name, func(t *testing.T) {
			cross := 0
			for seed := range 40 {
				h := newHarness(t, gateway(func(g *config.PD) { g.Topology = tc.topology }), pods...)
				h.deps.Rand = rand.New(rand.NewPCG(uint64(seed), 26)).IntN
				d := h.mustPick(prompt("topology ", 64))
				if d.Outcome != picker.OutcomePD {
					t.Fatalf("seed %d: outcome %s, want a pair", seed, d.Outcome)
				}
				zp, zd := zone(h, d)
				step := pairDistanceStep(d)
				if zp != zd {
					cross++
				}
				switch {
				case tc.topology.Len() > 0 && step != StepPairDistance+":2":
					t.Errorf("seed %d: trace %v: want %s:2 (same zone, other node)", seed, d.Trace.Steps, StepPairDistance)
				case tc.topology.Len() == 0 && step != "":
					t.Errorf("seed %d: trace %v: no %s step without topology labels", seed, d.Trace.Steps, StepPairDistance)
				}
			}
			if cross < tc.minCross || cross > tc.maxCross {
				t.Errorf("%d of 40 pairs crossed zones, want %d to %d", cross, tc.minCross, tc.maxCross)
			}
		})
	}
}

// A preference, never a filter: when every pair is far (each pod in a zone of its own) a
// pair is still picked, and a cheaper far pair beats a dearer near one.
func TestTopologyNeverEmptiesCandidates(t *testing.T) {
	t.Run("all pairs far", func(t *testing.T) {
		h := newHarness(t, gateway(nil), in(P("pA", "A"), "a"), in(D("dA", "A"), "b"), in(P("pB", "B"), "c"), in(D("dB", "B"), "d"))
		for i := range 10 {
			d, err := h.pick(prompt("far ", 64), nil)
			if err != nil || d.Outcome != picker.OutcomePD || len(d.Prefill) == 0 || len(d.Destination) == 0 {
				t.Fatalf("pick %d: %v, %v: want a pair though every pair crosses zones", i, d, err)
			}
			if s := pairDistanceStep(d); s != StepPairDistance+":3" {
				t.Errorf("pick %d: trace %v: want %s:3", i, d.Trace.Steps, StepPairDistance)
			}
		}
	})
	t.Run("a cheaper far pair wins", func(t *testing.T) {
		// pA1 shares dA's zone but has 6 prefills in flight; pA0 is idle in the other zone.
		h := newHarness(t, gateway(func(g *config.PD) { g.PrefixCache.StandardDeviationFactor = 100 }),
			in(P("pA0", "A"), "a"), in(P("pA1", "A"), "b"), in(D("dA", "A"), "b"))
		h.prefillInFlight("pA1", 6)
		d := h.mustPick(prompt("cost ", 64))
		if first(d.Prefill) != "pA0" || first(d.Destination) != "dA" {
			t.Fatalf("pair %s → %s (steps %v): want the idle pA0 though it is in the other zone", first(d.Prefill), first(d.Destination), d.Trace.Steps)
		}
	})
}

// A pool whose pods all share their placement (or carry no topology label) runs step 5 as
// without topology: the step is not traced.
func TestTopologyOffWhenPlacementsEqual(t *testing.T) {
	for _, pods := range [][]pod{
		{P("pA", "A"), D("dA", "A"), P("pB", "B"), D("dB", "B")},
		{in(P("pA", "A"), "a"), in(D("dA", "A"), "a")},
	} {
		h := newHarness(t, gateway(nil), pods...)
		if len(pods) == 2 { // one pod per side, both on one node
			pods[1].labels = pods[0].labels
			h.publish(pods...)
		}
		d := h.mustPick(prompt("same ", 64))
		if s := pairDistanceStep(d); s != "" {
			t.Errorf("pods %v: trace %v: want no %s step", names(h.store.Load().Endpoints), d.Trace.Steps, StepPairDistance)
		}
	}
}

func TestTopologyDistance(t *testing.T) {
	l := config.DefaultTopologyLabels()
	node := func(n, clique, zone string) map[string]string {
		m := map[string]string{}
		for k, v := range map[string]string{config.LabelHostname: n, config.LabelGPUClique: clique, config.LabelZone: zone} {
			if v != "" {
				m[k] = v
			}
		}
		return m
	}
	for _, tc := range []struct {
		a, b map[string]string
		want int
	}{
		{node("n1", "c1", "z1"), node("n1", "c1", "z1"), 0},
		{node("n1", "c1", "z1"), node("n2", "c1", "z1"), 1},
		{node("n1", "", "z1"), node("n2", "", "z1"), 2},
		{node("n1", "c1", "z1"), node("n2", "c2", "z2"), 3},
		{node("", "", ""), node("", "", ""), 3}, // unknown is far
		{node("n1", "", ""), node("n1", "", "z9"), 0},
	} {
		if got := l.Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%v, %v) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// llm-d's disagg handler picks each side on its own: topology reorders the prefill ranking
// only among the pods that tie with its pick, nearest to the decode pick first.
func TestNearestTiedPrefill(t *testing.T) {
	ep := func(name, zone string) *pool.Endpoint {
		return pool.NewEndpoint("ns", name, "10.0.0.1", 8000, 0, map[string]string{config.LabelZone: zone}, nil)
	}
	p0, p1, p2, dec := ep("p0", "b"), ep("p1", "a"), ep("p2", "a"), ep("d", "a")
	ranked := []*pool.Endpoint{p0, p1, p2}
	for _, tc := range []struct {
		name     string
		topology config.TopologyLabels
		scores   []float64 // of p0, p1, p2 (higher is better)
		want     string
	}{
		{"p1 ties with the pick and shares the decode pod's zone", config.DefaultTopologyLabels(), []float64{1, 1, 0.5}, "p0 p1 p2 → p1 p0 p2"},
		{"p1 scores lower: the pick stays", config.DefaultTopologyLabels(), []float64{1, 0.9, 0.9}, "p0 p1 p2 → p0 p1 p2"},
		{"no topology", config.TopologyLabels{}, []float64{1, 1, 1}, "p0 p1 p2 → p0 p1 p2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := &picker.ProfileResult{Ranked: ranked}
			for i, e := range ranked {
				pr.Scored = append(pr.Scored, picker.ScoredEndpoint{Endpoint: e, Score: tc.scores[i]})
			}
			got := strings.Join(names(nearestTied(tc.topology, pr, dec)), " ")
			if want := tc.want[strings.Index(tc.want, "→ ")+len("→ "):]; got != want {
				t.Errorf("ranking %s, want %s", got, want)
			}
		})
	}
}

// Ties wider than nearPairWidth: twelve idle decode pods of one roleset, all as near to the one
// prefill pod, all cost the same; over many picks every one of them is chosen, not only the
// first nearPairWidth in pod order.
func TestTopologyWideTiesReachEveryPod(t *testing.T) {
	pods := []pod{in(P("p", "A"), "a")}
	for k := range 12 {
		pods = append(pods, in(D("d"+strings.Repeat("x", k), "A"), "a"))
	}
	picked := map[string]bool{}
	for seed := range 120 {
		h := newHarness(t, gateway(nil), pods...)
		h.deps.Rand = rand.New(rand.NewPCG(uint64(seed), 7)).IntN
		d := h.mustPick(prompt("wide ", 64))
		if d.Outcome != picker.OutcomePD {
			t.Fatalf("seed %d: outcome %s, want a pair", seed, d.Outcome)
		}
		picked[d.Destination[0].Name] = true
	}
	if len(picked) != 12 {
		t.Errorf("%d of 12 tied decode pods were ever picked: %v", len(picked), picked)
	}
}
