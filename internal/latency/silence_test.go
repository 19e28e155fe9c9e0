package latency

import (
	"math"
	"testing"
	"time"
)

// The stall detector alone: 16 chunk gaps of 10 ms teach the usual gap (mean 10 ms, no
// deviation), so a silence longer than 2·10 ms is a stall; what a prefill explains (allow)
// does not count.
func TestSilence(t *testing.T) {
	t0 := time.Unix(1000, 0)
	gap := 10 * time.Millisecond
	learned := func() (*silence, time.Time) {
		var s silence
		at := t0
		for range minGaps {
			at = at.Add(gap)
			s.progress(at, gap, 0, time.Time{})
		}
		return &s, at
	}
	var fresh silence
	fresh.progress(t0, gap, 0, time.Time{})
	if l := fresh.limit(); !math.IsInf(l, 1) {
		t.Fatalf("limit after one gap %v, want +Inf (fewer than %d gaps)", l, minGaps)
	}
	s, last := learned()
	if l := s.limit(); !near(l, 0.02, 1e-9) {
		t.Fatalf("limit %.4f, want 0.02 (two gaps of 10 ms)", l)
	}
	for _, c := range []struct {
		name         string
		after, allow float64
		want         float64
	}{
		{"15 ms: within the limit", 0.015, 0, 0},
		{"50 ms: stalled about as long again", 0.05, 0, 0.05},
		{"50 ms, 40 of them a prefill: 10 ms unexplained", 0.05, 0.04, 0},
		{"30 s: bounded to maxStallAhead", 30, 0, maxStallAhead},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := s.stallAhead(last.Add(secs(c.after)), c.allow); !near(got, c.want, 1e-9) {
				t.Errorf("stall ahead %.4f, want %.4f", got, c.want)
			}
		})
	}

	// A chunk after 50 ms of silence: a stall of 0.05 s is learned; its gap, clipped to the
	// limit (20 ms), moves the usual gap by 0.05·(0.02 − 0.01) and its deviation by 0.05·0.01.
	s.progress(last.Add(50*time.Millisecond), 50*time.Millisecond, 0, time.Time{})
	if s.stallN != 1 || !near(s.stallLen, 0.05, 1e-9) {
		t.Errorf("stalls %d of %.4f s, want 1 of 0.05", s.stallN, s.stallLen)
	}
	if !near(s.gapMean, 0.0105, 1e-9) || !near(s.gapDev, 0.0005, 1e-9) || s.gapN != minGaps+1 {
		t.Errorf("gap %.5f ± %.5f over %d, want 0.01050 ± 0.00050 over %d", s.gapMean, s.gapDev, s.gapN, minGaps+1)
	}

	// A gap that held a prefill's end teaches nothing.
	s, last = learned()
	s.progress(last.Add(gap), gap, 0, last.Add(gap/2))
	if s.gapN != minGaps {
		t.Errorf("a gap holding a prefill end was learned (%d gaps)", s.gapN)
	}
}

// A pod's progress starts with its first stream, not with a later one; ends never count
// below zero.
func TestSilenceStreams(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s silence
	s.started(t0)
	s.started(t0.Add(time.Second))
	if s.streams != 2 || s.progressAt != t0 {
		t.Errorf("%d streams, progress at %v, want 2 from t0", s.streams, s.progressAt.Sub(t0))
	}
	for range 3 {
		s.ended()
	}
	if s.streams != 0 {
		t.Errorf("%d streams after more ends than starts, want 0", s.streams)
	}
}
