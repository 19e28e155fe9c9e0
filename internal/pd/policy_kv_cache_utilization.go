package pd

import "github.com/tandem-epp/tandem/internal/config"

// PolicyKVCacheUtilization is the decode policy that prefers the pod with the most free KV cache.
const PolicyKVCacheUtilization = config.PolicyKVCacheUtilization

var _ = builtinDecodePolicy(kvCacheUtilizationDecode{})

// kvCacheUtilizationDecode: the pod's KV-cache utilisation in percent as the seed rounds it
// (100 − FreeGPU; a pod whose utilisation was never scraped counts as empty, as the seed's
// load_balancing counts it), plus its requests over the batch's most, a fraction below one
// that breaks ties within a percentage point by load. A decode pod's KV fills with the
// prompts it holds and the tokens they generate, and one that runs out preempts; this keeps
// the fullest pods for last, as llm-d's kv-cache-utilization scorer does for any pod.
type kvCacheUtilizationDecode struct{}

func (kvCacheUtilizationDecode) Name() string    { return PolicyKVCacheUtilization }
func (kvCacheUtilizationDecode) ColdStart() bool { return false }
func (kvCacheUtilizationDecode) FastPath() bool  { return true }
func (kvCacheUtilizationDecode) DrainFree()      {}
func (kvCacheUtilizationDecode) Score(b *DecodeBatch, i int) float64 {
	p := &b.Pods[i]
	return 100 - p.FreeGPU + p.Requests()/b.MaxRequests
}
