package latency

import "math"

// errorStats accumulates TTFT predictions against their outcomes: the absolute error
// relative to the observed TTFT, and log2(observed ÷ predicted) in eighths from −8 to +8
// (so percentiles need no stored samples).
type errorStats struct {
	n                int
	sumAbsRel, sumLn float64
	buckets          [errBuckets]int
}

const (
	errBuckets  = 129 // eighths of a doubling, −8..+8
	errPerOctet = 8
)

func (s *errorStats) add(predicted, observed float64) {
	if !(predicted > 0) || !(observed > 0) {
		return
	}
	s.n++
	s.sumAbsRel += math.Abs(observed-predicted) / observed
	l := math.Log2(observed / predicted)
	s.sumLn += l * math.Ln2
	i := int(math.Round(l*errPerOctet)) + errBuckets/2
	s.buckets[min(max(i, 0), errBuckets-1)]++
}

// ErrorSummary describes how far TTFT predictions were from the observed TTFT.
type ErrorSummary struct {
	N int
	// MeanAbsRel is the mean of |observed − predicted| ÷ observed.
	MeanAbsRel float64
	// Bias is the geometric mean of observed ÷ predicted (> 1: predictions too low).
	Bias float64
	// RatioP10, RatioP50, RatioP90 are percentiles of observed ÷ predicted (to an eighth of
	// a doubling).
	RatioP10, RatioP50, RatioP90 float64
}

func (s *errorStats) summary() ErrorSummary {
	if s.n == 0 {
		return ErrorSummary{}
	}
	out := ErrorSummary{N: s.n, MeanAbsRel: s.sumAbsRel / float64(s.n), Bias: math.Exp(s.sumLn / float64(s.n))}
	q := func(p float64) float64 {
		want := int(math.Ceil(p * float64(s.n)))
		seen := 0
		for i, c := range s.buckets {
			seen += c
			if seen >= want {
				return math.Exp2(float64(i-errBuckets/2) / errPerOctet)
			}
		}
		return math.Exp2(8)
	}
	out.RatioP10, out.RatioP50, out.RatioP90 = q(0.1), q(0.5), q(0.9)
	return out
}
