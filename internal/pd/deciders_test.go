package pd

import (
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// Step 1 on its own: the spread max − min of in-flight prefills must exceed the threshold
// (strictly); the least-loaded pod is chosen. A minSpread parameter overrides the profile's.
func TestPrefillImbalanceDecider(t *testing.T) {
	k := config.DefaultPD() // spread 16
	pods := func(n ...float64) []PrefillPod {
		out := make([]PrefillPod, len(n))
		for i, v := range n {
			out[i] = PrefillPod{InFlight: v}
		}
		return out
	}
	ten := 10.0
	cases := []struct {
		name string
		d    *PrefillImbalanceDecider
		pre  []PrefillPod
		want int
	}{
		{"17 − 0 > 16", &PrefillImbalanceDecider{}, pods(17, 0, 5), 1},
		{"16 − 0 is not > 16", &PrefillImbalanceDecider{}, pods(16, 0), -1},
		{"one pod", &PrefillImbalanceDecider{}, pods(100), -1},
		{"minSpread 10: 11 − 0 fires", &PrefillImbalanceDecider{minSpread: &ten}, pods(3, 11, 0), 2},
	}
	for _, tc := range cases {
		if got := tc.d.PrefillFastPath(&picker.Cycle{}, &k, tc.pre); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// Step 2 on its own, the three checks in order (the profile's thresholds: 16 requests,
// 2048 tok/s, ratio 1.5), each over the pods that have its metric.
func TestDecodeImbalanceDecider(t *testing.T) {
	k := config.DefaultPD()
	e := func(n string) *pool.Endpoint { return pool.NewEndpoint("ns", n, "10.7.0.1", 8000, 0, nil, nil) }
	cases := []struct {
		name string
		pods []DecodePod
		pod  int
		step string
	}{
		{"requests 16 − 0 ≥ 16", []DecodePod{{Running: 16, HasRunning: true}, {Running: 0, HasRunning: true}}, 1, StepDecodeRequests},
		{"a pod without the running metric is left out", []DecodePod{{Running: 16, HasRunning: true}, {Running: 0}}, -1, ""},
		{"throughput 3000 − 900 > 2048", []DecodePod{{Throughput: 3000, HasThroughput: true}, {Throughput: 900, HasThroughput: true}}, 1, StepDecodeThroughput},
		// Drain ratios 4/max(1, 0.1) = 4 and 1/max(1, 0.1) = 1: 4/1 > 1.5 → the second.
		{"drain ratio 4 > 1.5", []DecodePod{{Running: 4, Drain: 1}, {Running: 1, Drain: 1}}, 1, StepDecodeDrain},
		{"a pod not draining stops the ratio check", []DecodePod{{Running: 4, Drain: 1}, {Running: 1}}, -1, ""},
	}
	for _, tc := range cases {
		for i := range tc.pods {
			tc.pods[i].Endpoint = e(string(rune('a' + i)))
		}
		b := &DecodeBatch{Pods: tc.pods, Knobs: &k}
		pod, step := (&DecodeImbalanceDecider{}).DecodeFastPath(&picker.Cycle{}, b)
		if pod != tc.pod || step != tc.step {
			t.Errorf("%s: pod %d step %q, want %d %q", tc.name, pod, step, tc.pod, tc.step)
		}
	}
}
