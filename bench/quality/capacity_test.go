package main

import (
	"math"
	"testing"
)

// A toy engine with a known knee: below the knee every request meets its objectives; above
// it the share meeting them falls with the rate, crossing 90 % exactly at the knee. The search
// must land within 2 % below it, from a first guess on either side, far or near.
func TestCapacitySearchFindsKnee(t *testing.T) {
	for _, knee := range []float64{0.37, 1, 7.3, 42, 950} {
		for _, guess := range []float64{knee / 50, knee / 1.3, knee, knee * 1.01, knee * 3, knee * 60} {
			toy := func(rate float64) (bool, error) {
				good := 1.0
				if rate > knee {
					good = 1 - 0.1*rate/knee
				}
				return good >= goodFraction, nil
			}
			got, tried, err := searchCapacity(guess, toy)
			if err != nil {
				t.Fatal(err)
			}
			if got > knee || got < knee/capTolerance {
				t.Errorf("knee %v from guess %v: found %v (%d rates), want within 2 %% below", knee, guess, got, tried)
			}
		}
	}
}

// No rate meets the objectives: capacity 0 (reported as inf when it is the best baseline's);
// every rate does: the highest tried.
func TestCapacitySearchEdges(t *testing.T) {
	never := func(float64) (bool, error) { return false, nil }
	if got, _, _ := searchCapacity(1, never); got != 0 {
		t.Errorf("never meets: capacity %v, want 0", got)
	}
	always := func(float64) (bool, error) { return true, nil }
	if got, _, _ := searchCapacity(1, always); got != math.Pow(capStep, capSteps) {
		t.Errorf("always meets: capacity %v, want the highest rate tried %v", got, math.Pow(capStep, capSteps))
	}
	if fmtRatio(math.Inf(1)) != "inf" {
		t.Error("an infinite ratio prints as", fmtRatio(math.Inf(1)))
	}
}
