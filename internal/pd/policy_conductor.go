package pd

import "math"

var (
	_ = builtinPrefillPolicy(conductorPrefill{})
	_ = builtinDecodePolicy(conductorDecode{})
)

// Conductor's TTFT model coefficients (milliseconds), the seed's defaults.
const (
	conductorPrefixA  = 0.005 // prefix time = A·matched + B
	conductorPrefixB  = 1.0
	conductorPrefillA = 0.001 // prefill time = A·unmatched^B + C
	conductorPrefillB = 1.5
	conductorPrefillC = 5.0
	// conductorDefaultPrefillTokens sizes the queue estimate when the pod exports no
	// prefill-time histogram.
	conductorDefaultPrefillTokens = 512
)

// conductorPrefill estimates TTFT in ms: queue + cached-prefix time + unmatched prefill.
type conductorPrefill struct{}

func (conductorPrefill) Name() string     { return PolicyConductor }
func (conductorPrefill) UsesPrefix() bool { return true }
func (conductorPrefill) Score(b *PrefillBatch, i int) float64 {
	p := &b.Pods[i]
	total := float64(b.PromptTokens)
	if b.TokenizedLen > 0 {
		total = float64(b.TokenizedLen) // AIBrix counts its tokenizer's output (bytes by default)
	}
	matched := total * p.MatchPct / 100
	unmatched := total - matched
	avgMs := conductorPrefillMs(conductorDefaultPrefillTokens)
	if p.Sample != nil && p.Sample.HasPrefillTimeMean {
		avgMs = p.Sample.PrefillTimeMean * 1000
	}
	var queue, prefix float64
	if p.InFlight > 0 {
		queue = p.InFlight * avgMs
	}
	if matched > 0 {
		prefix = conductorPrefixA*matched + conductorPrefixB
	}
	return queue + prefix + conductorPrefillMs(unmatched)
}

func conductorPrefillMs(tokens float64) float64 {
	if tokens <= 0 {
		return 0
	}
	return conductorPrefillA*math.Pow(tokens, conductorPrefillB) + conductorPrefillC
}

// conductorDecode estimates the time between tokens in ms: 1000/throughput (20 ms when
// unknown), scaled by (1 + 1/max(requests, 1)), ×1.5 when KV usage is above 90%.
type conductorDecode struct{}

func (conductorDecode) Name() string    { return PolicyConductor }
func (conductorDecode) ColdStart() bool { return true }
func (conductorDecode) FastPath() bool  { return true }
func (conductorDecode) Score(b *DecodeBatch, i int) float64 {
	p := &b.Pods[i]
	tbt := 20.0
	if p.Throughput > 0 {
		tbt = 1000 / p.Throughput
	}
	est := tbt * (1 + 1/math.Max(p.Requests(), 1))
	if 1-p.FreeGPU/100 > 0.9 {
		est *= 1.5
	}
	return est
}
