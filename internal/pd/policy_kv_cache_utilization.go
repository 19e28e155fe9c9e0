package pd

import "github.com/tandem-epp/tandem/internal/config"

// PolicyKVCacheUtilization is the decode policy that prefers the pod with the most free KV cache.
const PolicyKVCacheUtilization = config.PolicyKVCacheUtilization

var _ = builtinDecodePolicy(kvCacheUtilizationDecode{})

// kvCacheUtilizationDecode: the share of the pod's KV cache in use now, in percent. That is
// what the engine last reported (its KV usage, unrounded) plus the requests the gateway sent
// it since, each at the batch's mean KV per running request: the gateway's running + pending
// count beyond the engine's running count at the scrape (none when it is not beyond: requests
// that ended since, or other gateway replicas' requests the engine counts and this replica
// does not, without Redis). A pod whose usage is not scraped (new, stale, or an engine
// without the metric) is estimated from its requests alone the same way, so it neither wins
// by default nor is shut out; picks between two scrapes spread as the estimates grow. Equal
// estimates (an idle pool, whose scrapes show no KV per request yet) go to the pod with the
// fewest requests. A decode pod's KV fills with
// the prompts it holds and the tokens they generate, and one that runs out preempts, so the
// seed's throughput fast path (which sends the request to the slowest pod, often the one
// preempting) is off, as for token_load.
type kvCacheUtilizationDecode struct{}

func (kvCacheUtilizationDecode) Name() string    { return PolicyKVCacheUtilization }
func (kvCacheUtilizationDecode) ColdStart() bool { return false }
func (kvCacheUtilizationDecode) FastPath() bool  { return false }
func (kvCacheUtilizationDecode) DrainFree()      {}
func (kvCacheUtilizationDecode) Score(b *DecodeBatch, i int) float64 {
	p := &b.Pods[i]
	perRequest := b.Memo("kv_cache_utilization.per_request", func() float64 { return kvPerRequest(b) })
	est := perRequest * p.Requests()
	if used, scraped := scrapedKV(p); scraped {
		est = used + perRequest*max(p.Requests()-p.Sample.Running, 0)
	}
	return est + requestTieBreak*p.Requests()
}

// requestTieBreak is the share of a percent a request adds to a pod's score: it orders pods
// of equal estimated KV by their requests, and never outweighs a real difference of KV.
const requestTieBreak = 1e-6

// scrapedKV is the pod's KV usage in percent at its last scrape, when the engine reported it
// with its running count.
func scrapedKV(p *DecodePod) (float64, bool) {
	if s := p.Sample; s != nil && s.HasKVUsage && s.HasRunning {
		return 100 * s.KVUsage, true
	}
	return 0, false
}

// kvPerRequest is the batch's KV per running request, in percent of a pod's cache: the
// scraped usage over the scraped running requests, summed over the pods that report both
// (0 when none runs anything).
func kvPerRequest(b *DecodeBatch) float64 {
	var used, running float64
	for j := range b.Pods {
		if u, ok := scrapedKV(&b.Pods[j]); ok {
			used += u
			running += b.Pods[j].Sample.Running
		}
	}
	if running == 0 {
		return 0
	}
	return used / running
}
