package pd

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/latency"
	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/picker"
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
	// TokenizedLen is the length of the prefix tokenizer's output (picker.PrefixText: bytes
	// of the prompt, or four per cl100k_base id with the tiktoken tokenizer): AIBrix's
	// totalTokens, which conductor's costs count. Set for conductor only; 0: PromptTokens.
	TokenizedLen int
	Knobs        *config.PD
	// Objective is the request's latency objectives (the predictive policies' units).
	Objective Objective

	// fc caches each pod's latency forecast for this request (the predictive policies').
	fc []latency.Forecast
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
	// Drain is the pod's completed requests per second over the last minute (0, unread,
	// when neither the decode fast path nor the policy uses it: see DrainFree).
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
	// PromptTokens and Objective: the request's prompt estimate and latency objectives.
	PromptTokens int
	Objective    Objective
	fc           []latency.Forecast

	// memo holds the batch-wide figures policies computed once (Memo).
	memo []batchFigure
}

// batchFigure is one figure of a batch's memo.
type batchFigure struct {
	key   string
	value float64
}

// Memo is f() computed once per batch (one request's) under key: a figure every pod's score
// reads, such as a mean over the pods, without an O(pods²) pick. key names the policy and
// the figure (e.g. "token_load.rate").
func (b *DecodeBatch) Memo(key string, f func() float64) float64 {
	for _, m := range b.memo {
		if m.key == key {
			return m.value
		}
	}
	v := f()
	b.memo = append(b.memo, batchFigure{key, v})
	return v
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

// DrainFree is implemented by decode policies that never read DecodePod.Drain: when the
// decode fast path does not run either, a batch is built without reading the drain rates.
type DrainFree interface {
	DrainFree()
}

// ForecastOnly is implemented by score policies that read nothing of a pod but its endpoint,
// roleset and (prefill) prefix match: they score from the pods' latency forecasts, and a
// decode one takes no seed cold-start score. When nothing else of the pick reads them (no
// fast path, no standard-deviation skip), a batch is built without the pods' counted and
// scraped signals (a PrefillPod's InFlight and Sample, a DecodePod's Running, Pending,
// Throughput, FreeGPU, Drain and Sample, the batch maxima stay at their zero values).
type ForecastOnly interface {
	ForecastOnly()
}

// decodeReads is what a decode batch reads of each pod beyond its endpoint and roleset.
type decodeReads int

const (
	readForecastOnly decodeReads = iota // nothing: a ForecastOnly policy, no fast path
	readSignals                         // the counted and scraped signals, not the drain rates
	readDrain                           // the signals and the drain rates
)

// decodeReadsOf is what a batch for pol must read, with the decode fast path run or not.
func decodeReadsOf(pol DecodePolicy, fast bool) decodeReads {
	_, drainFree := pol.(DrainFree)
	_, forecastOnly := pol.(ForecastOnly)
	switch {
	case fast || !drainFree:
		return readDrain
	case forecastOnly:
		return readForecastOnly
	}
	return readSignals
}

// Charger is implemented by policies that keep their own ledger (token-load policies):
// Charge runs inside the selection critical section, right after the pair is chosen, so
// concurrent picks see each other's charges. It returns what to release when the prefill
// leg ends and when the request completes (either may be nil); each runs at most once.
type Charger interface {
	Charge(req *request.Request, prefill, decode *pool.Endpoint) (prefillDone, requestDone func())
}

// CycleCharger is a Charger that reads what its scoring wrote in the cycle (the batch it
// scored: the request's knobs, the chosen pod's prefix match); the chain prefers it.
type CycleCharger interface {
	ChargeCycle(c *picker.Cycle, prefill, decode *pool.Endpoint) (prefillDone, requestDone func())
}

// Policies are the registries of prefill and decode policies. Safe for concurrent use.
type Policies struct {
	mu      sync.RWMutex
	prefill map[string]PrefillPolicy
	decode  map[string]DecodePolicy
}

// The seed's built-in policies; each policy's file adds itself (see doc.go).
var (
	builtinPrefill []PrefillPolicy
	builtinDecode  []DecodePolicy
)

func builtinPrefillPolicy(p PrefillPolicy) bool {
	builtinPrefill = append(builtinPrefill, p)
	return true
}
func builtinDecodePolicy(p DecodePolicy) bool { builtinDecode = append(builtinDecode, p); return true }

// NewPolicies returns registries holding the seed's built-in policies.
func NewPolicies() *Policies {
	p := &Policies{prefill: map[string]PrefillPolicy{}, decode: map[string]DecodePolicy{}}
	for _, pol := range builtinPrefill {
		p.RegisterPrefill(pol)
	}
	for _, pol := range builtinDecode {
		p.RegisterDecode(pol)
	}
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
