package bucketserve

import (
	"math"
	"time"
)

// Histogram geometry: 8 bins per octave (about 9 % wide), lengths up to 2^21 tokens.
const (
	BinsPerOctave = 8
	Octaves       = 21
	Bins          = BinsPerOctave * Octaves
	// HalfLife is how fast old traffic fades: its weight halves every 30 s.
	HalfLife = 30 * time.Second
)

// Bin is the histogram bin of a prompt length: floor(log2(n)·8), lengths below 1 in bin 0,
// lengths beyond the range in the last bin.
func Bin(n int) int {
	if n <= 1 {
		return 0
	}
	b := int(math.Floor(math.Log2(float64(n)) * BinsPerOctave))
	return min(b, Bins-1)
}

// Center is a bin's representative length: round(2^((bin+0.5)/8)).
func Center(bin int) int {
	return int(math.Round(math.Exp2((float64(bin) + 0.5) / BinsPerOctave)))
}

// lowerEdge is the shortest length in a bin: ceil(2^(bin/8)).
func lowerEdge(bin int) int {
	return int(math.Ceil(math.Exp2(float64(bin) / BinsPerOctave)))
}

// histogram is decayed request counts and prompt-token mass per bin.
type histogram struct {
	weights [Bins]float64 // requests
	masses  [Bins]float64 // prompt tokens
	at      time.Time     // when the decay was last applied
}

func (h *histogram) decay(now time.Time) {
	if h.at.IsZero() {
		h.at = now
		return
	}
	dt := now.Sub(h.at)
	if dt <= 0 {
		return
	}
	f := math.Pow(0.5, dt.Seconds()/HalfLife.Seconds())
	for i := range h.weights {
		h.weights[i] *= f
		h.masses[i] *= f
	}
	h.at = now
}

func (h *histogram) observe(n int, now time.Time) {
	h.decay(now)
	b := Bin(n)
	h.weights[b]++
	h.masses[b] += float64(max(n, 0))
}

// vector is the histogram in the plan's unit.
func (h *histogram) vector(mode Mode) *[Bins]float64 {
	if mode == RPS {
		return &h.weights
	}
	return &h.masses
}
