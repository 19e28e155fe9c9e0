package bucketserve

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestBinGeometry(t *testing.T) {
	cases := []struct{ n, bin, center int }{
		{0, 0, 1}, {1, 0, 1},
		{100, 53, 103},   // floor(log2(100)·8) = floor(53.15); 2^(53.5/8) = 103.1
		{300, 65, 292},   // floor(65.83); 2^(65.5/8) = 291.6
		{1000, 79, 981},  // floor(79.73); 2^(79.5/8) = 980.6
		{1024, 80, 1069}, // exactly 2^10: bin 80
		{3000, 92, 3025}, // floor(92.41); 2^(92.5/8) = 3024.6
		{1 << 30, Bins - 1, Center(Bins - 1)},
	}
	for _, tc := range cases {
		if b := Bin(tc.n); b != tc.bin || Center(b) != tc.center {
			t.Errorf("len %d: bin %d center %d, want %d %d", tc.n, b, Center(b), tc.bin, tc.center)
		}
	}
}

// vec builds a histogram vector from (length, requests) pairs in the mode's unit.
func vec(mode Mode, traffic ...[2]int) *[Bins]float64 {
	var h histogram
	for _, tr := range traffic {
		for range tr[1] {
			h.observe(tr[0], time.Time{})
		}
	}
	return h.vector(mode)
}

func TestComputeBands(t *testing.T) {
	inf := Unlimited
	cases := []struct {
		name    string
		mode    Mode
		groups  []Group
		traffic [][2]int
		want    []Band
	}{
		{
			// Tokens 10 000 + 100 000 short (shared), 400 000 long (B only). Targets 255 000 each:
			// B's exclusive traffic already exceeds its share, so all the shared range goes to A.
			"throughput: the swamped roleset gets no share of the overlap", Throughput,
			[]Group{{"A", 0, 2047, 1}, {"B", 0, inf, 1}},
			[][2]int{{100, 100}, {1000, 100}, {4000, 100}},
			[]Band{{"A", 0, 2047}},
		},
		{
			// Requests: 100 + 100 shared, 100 B-only. Targets 150: need A 150, B 50. Cut at 150
			// of the 200 shared requests: reached in the bin of 1000 → cut at that bin's upper
			// edge, 2^10 = 1024.
			"rps: shared range split by need at a traffic quantile", RPS,
			[]Group{{"A", 0, 2047, 1}, {"B", 0, inf, 1}},
			[][2]int{{100, 100}, {1000, 100}, {4000, 100}},
			[]Band{{"A", 0, 1023}, {"B", 1024, 2047}},
		},
		{
			// 400 requests over one shared range; 3:1 replicas → need 300:100; the 300th
			// request falls in the bin of 1000.
			"rps: replica-proportional shares", RPS,
			[]Group{{"A", 0, inf, 3}, {"B", 0, inf, 1}},
			[][2]int{{100, 100}, {300, 100}, {1000, 100}, {3000, 100}},
			[]Band{{"A", 0, 1023}, {"B", 1024, inf}},
		},
		{
			"disjoint ranges: nothing shared, no bands", Throughput,
			[]Group{{"A", 0, 1000, 1}, {"B", 1001, inf, 1}},
			[][2]int{{100, 10}, {5000, 10}},
			nil,
		},
		{
			"no traffic: no plan", Throughput,
			[]Group{{"A", 0, inf, 1}, {"B", 0, inf, 1}},
			nil,
			nil,
		},
		{
			// The shared range holds 1 of 100 requests (< 5 %): not worth banding.
			"a thin overlap is not banded", RPS,
			[]Group{{"A", 0, 200, 1}, {"B", 150, inf, 1}},
			[][2]int{{100, 50}, {180, 1}, {5000, 49}},
			nil,
		},
	}
	for _, tc := range cases {
		got := computeBands(vec(tc.mode, tc.traffic...), tc.groups)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.name, got, tc.want)
		}
	}
}

// At most 16 bands: 20 rolesets sharing one range get 16 bands, contiguous and ordered.
func TestBandBudget(t *testing.T) {
	var groups []Group
	for i := range 20 {
		groups = append(groups, Group{Name: string(rune('a' + i)), Min: 0, Max: Unlimited, Replicas: 1})
	}
	var traffic [][2]int
	for n := 16; n < 1<<17; n *= 2 {
		traffic = append(traffic, [2]int{n, 10}, [2]int{n * 3 / 2, 10})
	}
	bands := computeBands(vec(RPS, traffic...), groups)
	if len(bands) != MaxBands {
		t.Fatalf("%d bands, want %d: %v", len(bands), MaxBands, bands)
	}
	if bands[0].Min != 0 || bands[len(bands)-1].Max != Unlimited {
		t.Fatalf("bands do not span the range: %v", bands)
	}
	for i := 1; i < len(bands); i++ {
		if bands[i].Min != bands[i-1].Max+1 {
			t.Fatalf("bands not contiguous at %d: %v", i, bands)
		}
	}
}

func TestDecayHalvesEveryThirtySeconds(t *testing.T) {
	var h histogram
	t0 := time.Unix(1_700_000_000, 0)
	for range 8 {
		h.observe(1000, t0)
	}
	h.decay(t0.Add(HalfLife))
	if w, m := h.weights[Bin(1000)], h.masses[Bin(1000)]; math.Abs(w-4) > 1e-9 || math.Abs(m-4000) > 1e-6 {
		t.Fatalf("after 30 s: %v requests, %v tokens; want 4 and 4000", w, m)
	}
	h.decay(t0.Add(2 * HalfLife))
	if w := h.weights[Bin(1000)]; math.Abs(w-2) > 1e-9 {
		t.Fatalf("after 60 s: %v, want 2", w)
	}
}
