package baseline

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// Policy names, as the seed names them.
const (
	PolicyPrefixCache   = "prefix_cache"
	PolicyLeastRequest  = "least_request"
	PolicyConductor     = "conductor"
	PolicyLoadBalancing = "load_balancing"
)

// PrefillPod is what a prefill policy knows about one candidate.
type PrefillPod struct {
	Endpoint *pool.Endpoint
	Roleset  string
	// InFlight is the number of prefill requests Tandem has in flight on the pod.
	InFlight float64
	// MatchPct is the prompt's prefix match on the pod, 0..100 (before MinMatchPct).
	MatchPct float64
	Sample   *metrics.Sample // nil when never scraped
}

// PrefillBatch is one request's prefill candidates.
type PrefillBatch struct {
	Pods []PrefillPod
	// MaxInFlight is max(1, InFlight over all candidates).
	MaxInFlight  float64
	PromptTokens int
	// TokenizedLen is AIBrix's totalTokens (the prefix tokenizer's output length), which
	// conductor counts since it was made to match AIBrix (issue 29); 0: PromptTokens.
	TokenizedLen int
	Knobs        *config.PD
}

// PrefillPolicy scores prefill pods; lower is better.
type PrefillPolicy interface {
	Name() string
	// UsesPrefix reports whether Score reads MatchPct (the cascade then hashes the prompt
	// and warms the prefix index with the chosen prefill pod).
	UsesPrefix() bool
	Score(b *PrefillBatch, i int) float64
}

// DecodePod is what a decode policy knows about one candidate.
type DecodePod struct {
	Endpoint *pool.Endpoint
	Roleset  string
	// Running is RealtimeNumRequestsRunning (gateway-side); HasRunning is false for a pod
	// the gateway never counted (freshly started).
	Running    float64
	HasRunning bool
	// Pending is the number of requests picked for the pod whose decode has not started.
	Pending float64
	// Throughput is the scraped generation throughput (tokens/s), 0 when missing.
	Throughput    float64
	HasThroughput bool
	// FreeGPU is round(100 − KV usage %), at least 0.1; 100 when KV usage is missing.
	FreeGPU float64
	// Drain is the pod's completed requests per second over the last minute.
	Drain  float64
	Sample *metrics.Sample
}

// Requests is the seed's effective request count: running + pending.
func (p *DecodePod) Requests() float64 { return p.Running + p.Pending }

// DecodeBatch is one request's decode candidates, with the maxima of the fast-path pass
// (taken over every decode candidate before any narrowing, each at least 1).
type DecodeBatch struct {
	Pods          []DecodePod
	MaxRequests   float64
	MaxThroughput float64
	MaxFreeGPU    float64
	Knobs         *config.PD
}

// DecodePolicy scores decode pods; lower is better.
type DecodePolicy interface {
	Name() string
	// ColdStart reports whether pods without the running metric get the seed's cold-start
	// score (1.0 + pending) when a sibling has metrics.
	ColdStart() bool
	// FastPath reports whether the decode load-imbalance fast path may decide.
	FastPath() bool
	Score(b *DecodeBatch, i int) float64
}

// Charger is implemented by policies that keep their own ledger (token-load policies):
// Charge runs inside the selection critical section, right after the pair is chosen, so
// concurrent picks see each other's charges. It returns what to release when the prefill
// leg ends and when the request completes (either may be nil); each runs at most once.
type Charger interface {
	Charge(req *request.Request, prefill, decode *pool.Endpoint) (prefillDone, requestDone func())
}

// Policies are the registries of prefill and decode policies. Safe for concurrent use.
type Policies struct {
	mu      sync.RWMutex
	prefill map[string]PrefillPolicy
	decode  map[string]DecodePolicy
}

// NewPolicies returns registries holding the seed's built-in policies.
func NewPolicies() *Policies {
	p := &Policies{prefill: map[string]PrefillPolicy{}, decode: map[string]DecodePolicy{}}
	p.RegisterPrefill(prefixCachePolicy{})
	p.RegisterPrefill(leastRequestPrefill{})
	p.RegisterPrefill(conductorPrefill{})
	p.RegisterDecode(loadBalancingPolicy{})
	p.RegisterDecode(leastRequestDecode{})
	p.RegisterDecode(conductorDecode{})
	return p
}

// RegisterPrefill adds or replaces a prefill policy under its name.
func (p *Policies) RegisterPrefill(pol PrefillPolicy) {
	p.mu.Lock()
	p.prefill[pol.Name()] = pol
	p.mu.Unlock()
}

// RegisterDecode adds or replaces a decode policy under its name.
func (p *Policies) RegisterDecode(pol DecodePolicy) {
	p.mu.Lock()
	p.decode[pol.Name()] = pol
	p.mu.Unlock()
}

// Prefill returns a registered prefill policy.
func (p *Policies) Prefill(name string) (PrefillPolicy, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	pol, ok := p.prefill[name]
	return pol, ok
}

// Decode returns a registered decode policy.
func (p *Policies) Decode(name string) (DecodePolicy, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	pol, ok := p.decode[name]
	return pol, ok
}

// Names lists the registered prefill and decode policy names, sorted.
func (p *Policies) Names() (prefill, decode []string) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for k := range p.prefill {
		prefill = append(prefill, k)
	}
	for k := range p.decode {
		decode = append(decode, k)
	}
	slices.Sort(prefill)
	slices.Sort(decode)
	return prefill, decode
}

// resolve picks the request's policies. Prefill: the profile's name, else the request's
// resolved name, else the gateway's, else prefix_cache — the first one registered, with a
// note naming any that was not. Decode: the profile's name, else the resolved one; an
// unregistered decode name is an error, as the seed has it.
func (p *Policies) resolve(gatewayPrefill string, knobs *config.PD, rc *config.RoutingConfig) (PrefillPolicy, DecodePolicy, string, error) {
	var note string
	var pre PrefillPolicy
	for _, name := range []string{rc.PrefillScorePolicy, knobs.PrefillScorePolicy, gatewayPrefill, PolicyPrefixCache} {
		if name == "" {
			continue
		}
		if pol, ok := p.Prefill(name); ok {
			pre = pol
			break
		}
		if !strings.Contains(note, strconv.Quote(name)) {
			note += fmt.Sprintf("prefill policy %q unknown; ", name)
		}
	}
	name := knobs.DecodeScorePolicy
	if rc.DecodeScorePolicy != "" {
		name = rc.DecodeScorePolicy
	}
	dec, ok := p.Decode(name)
	if !ok {
		_, known := p.Names()
		return nil, nil, note, fmt.Errorf("decode score policy %q is not registered; valid: %s", name, strings.Join(known, ", "))
	}
	return pre, dec, note, nil
}

// prefixCachePolicy: (100 − match%)·0.1 + inFlight/maxInFlight, match below MinMatchPct = 0.
type prefixCachePolicy struct{}

func (prefixCachePolicy) Name() string     { return PolicyPrefixCache }
func (prefixCachePolicy) UsesPrefix() bool { return true }
func (prefixCachePolicy) Score(b *PrefillBatch, i int) float64 {
	p := &b.Pods[i]
	match := p.MatchPct
	if match < b.Knobs.MinMatchPct {
		match = 0
	}
	return (100-match)*0.1 + p.InFlight/b.MaxInFlight
}

// leastRequestPrefill: the prefill requests in flight.
type leastRequestPrefill struct{}

func (leastRequestPrefill) Name() string                         { return PolicyLeastRequest }
func (leastRequestPrefill) UsesPrefix() bool                     { return false }
func (leastRequestPrefill) Score(b *PrefillBatch, i int) float64 { return b.Pods[i].InFlight }

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
		total = float64(b.TokenizedLen)
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

// leastRequestDecode: running + pending.
type leastRequestDecode struct{}

func (leastRequestDecode) Name() string                        { return PolicyLeastRequest }
func (leastRequestDecode) ColdStart() bool                     { return true }
func (leastRequestDecode) FastPath() bool                      { return true }
func (leastRequestDecode) Score(b *DecodeBatch, i int) float64 { return b.Pods[i].Requests() }

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
