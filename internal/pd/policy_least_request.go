package pd

var (
	_ = builtinPrefillPolicy(leastRequestPrefill{})
	_ = builtinDecodePolicy(leastRequestDecode{})
)

// leastRequestPrefill: the prefill requests in flight.
type leastRequestPrefill struct{}

func (leastRequestPrefill) Name() string                         { return PolicyLeastRequest }
func (leastRequestPrefill) UsesPrefix() bool                     { return false }
func (leastRequestPrefill) Score(b *PrefillBatch, i int) float64 { return b.Pods[i].InFlight }

// leastRequestDecode: running + pending.
type leastRequestDecode struct{}

func (leastRequestDecode) Name() string                        { return PolicyLeastRequest }
func (leastRequestDecode) ColdStart() bool                     { return true }
func (leastRequestDecode) FastPath() bool                      { return true }
func (leastRequestDecode) Score(b *DecodeBatch, i int) float64 { return b.Pods[i].Requests() }
