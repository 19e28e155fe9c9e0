package pd

var _ = builtinDecodePolicy(loadBalancingPolicy{})

// loadBalancingPolicy: (w_run·req/maxReq + w_thru·(1 − thr/maxThr)) / (free/maxFree).
type loadBalancingPolicy struct{}

func (loadBalancingPolicy) Name() string    { return PolicyLoadBalancing }
func (loadBalancingPolicy) ColdStart() bool { return true }
func (loadBalancingPolicy) FastPath() bool  { return true }
func (loadBalancingPolicy) Score(b *DecodeBatch, i int) float64 {
	p := &b.Pods[i]
	num := b.Knobs.DecodeLBWeightRunning*p.Requests()/b.MaxRequests +
		b.Knobs.DecodeLBWeightThroughput*(1-p.Throughput/b.MaxThroughput)
	return num / (p.FreeGPU / b.MaxFreeGPU)
}
