package pd

import (
	"sync"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// Token-load policy names, as the seed names them.
const (
	PolicyTokenLoad       = config.PolicyTokenLoad       // prefill and decode
	PolicyHybridCacheLoad = config.PolicyHybridCacheLoad // prefill
)

// TokenLoad holds the ledgers of the token-load policies. One per process: every cascade
// (and every policy instance) that scores from it sees the same charges.
type TokenLoad struct {
	Prefill  *ledger.Prefill
	Decode   *ledger.Decode
	Sessions *ledger.Sessions
	// Gateway knobs, used only if a charge cannot find the batch it was scored with.
	Gateway config.PD
}

// NewTokenLoad returns empty ledgers; the session table is capped at
// gateway.TokenLoadMaxSessions. Run ledger.RunJanitor over Sweepers() once a minute.
func NewTokenLoad(gateway config.PD, o ledger.Options) *TokenLoad {
	return &TokenLoad{Prefill: ledger.NewPrefill(o), Decode: ledger.NewDecode(o),
		Sessions: ledger.NewSessions(gateway.TokenLoadMaxSessions, o), Gateway: gateway}
}

// Sweepers are the janitor's passes over the ledgers and the session table.
func (t *TokenLoad) Sweepers() []ledger.Sweeper {
	return []ledger.Sweeper{t.Prefill, t.Decode, t.Sessions}
}

// registerTokenLoad registers token_load and hybrid_cache_load (prefill) and token_load
// (decode) on the cascade's registries, scoring from and charging tl (Options.TokenLoad; New
// calls it). Each cascade gets its
// own policy instances: a charge reads the batch its own cascade scored in the same
// critical section (the per-profile knobs and the chosen pod's prefix match), so do not
// share one Policies between cascades that register token-load.
//
// Charge lifecycle (pd's lifecycle calls the releases): the prefill charge's active part is
// released when the prefill leg ends — PrefillDone from an EPP hand-off, or, with a
// decode-side sidecar running the prefill leg, the decode leg's response headers (its first
// response byte: the sidecar only forwards decode's answer once its prefill call returned).
// The kv part and the decode charge are released at Done.
func (c *Cascade) registerTokenLoad(tl *TokenLoad) {
	c.Policies().RegisterPrefill(&tokenLoadPrefill{tl: tl})
	c.Policies().RegisterPrefill(&tokenLoadPrefill{tl: tl, hybrid: true})
	c.Policies().RegisterDecode(&tokenLoadDecode{tl: tl})
}

// tokenLoadPrefill is token_load (active + kv_weight·kv) or, with hybrid, hybrid_cache_load
// (that load discounted by the squared prefix match; the bare discount for an idle pod).
type tokenLoadPrefill struct {
	tl     *TokenLoad
	hybrid bool
	// last is the batch scored last, for Charge called outside a cycle (the chain charges
	// with ChargeCycle, from the batch the cycle scored). Score and Charge run in one
	// critical section, so at Charge it is the batch of the request being charged.
	last atomic.Pointer[PrefillBatch]
}

func (p *tokenLoadPrefill) Name() string {
	if p.hybrid {
		return PolicyHybridCacheLoad
	}
	return PolicyTokenLoad
}

func (p *tokenLoadPrefill) UsesPrefix() bool { return p.hybrid }

func (p *tokenLoadPrefill) Score(b *PrefillBatch, i int) float64 {
	if p.last.Load() != b { // not only at i = 0: the standard-deviation skip may pass over pod 0
		p.last.Store(b)
	}
	pod := &b.Pods[i]
	active, kv := p.tl.Prefill.Load(ledger.PodOf(pod.Endpoint))
	load := ledger.TokenLoad(active, kv, b.Knobs.TokenLoadKVWeight)
	if !p.hybrid {
		return load
	}
	return ledger.HybridScore(load, pod.MatchPct, b.Knobs.MinMatchPct, b.Knobs.HybridCacheLoadFactor)
}

// Charge implements Charger: request_cost + new_tokens on the prefill pod, new_tokens by
// the session delta, the unmatched part of the prompt (hybrid), or the whole prompt.
func (p *tokenLoadPrefill) Charge(req *request.Request, prefill, _ *pool.Endpoint) (func(), func()) {
	return p.charge(req, prefill, p.last.Load())
}

// ChargeCycle implements CycleCharger: Charge with the batch the cycle scored.
func (p *tokenLoadPrefill) ChargeCycle(cy *picker.Cycle, prefill, _ *pool.Endpoint) (func(), func()) {
	return p.charge(cy.Req, prefill, ScoredPrefillBatch(cy))
}

func (p *tokenLoadPrefill) charge(req *request.Request, prefill *pool.Endpoint, b *PrefillBatch) (func(), func()) {
	knobs, match := &p.tl.Gateway, 0.0
	if b != nil {
		knobs = b.Knobs
		for i := range b.Pods {
			if b.Pods[i].Endpoint == prefill {
				match = ledger.ClampMatch(b.Pods[i].MatchPct, knobs.MinMatchPct)
				break
			}
		}
	}
	delta, ok := p.tl.Sessions.Delta(req.Model, req.SessionKey, req.BodyTokens, knobs.TokenLoadSessionTTL)
	tokens, _ := ledger.NewTokens(req.BodyTokens, delta, ok, p.hybrid, match)
	ch := p.tl.Prefill.Acquire(ledger.PodOf(prefill), knobs.TokenLoadRequestCost+tokens, knobs.TokenLoadTTL)
	return ch.ReleaseActive, ch.ReleaseKV
}

// tokenLoadDecode is the token_load decode policy: decode_tokens + generated_tokens. The
// decode fast paths do not decide under it, and pods without metrics are scored from the
// ledger rather than given the cold-start score.
type tokenLoadDecode struct {
	tl *TokenLoad

	mu sync.Mutex
	// last is the batch scored last, for Charge called outside a cycle (its knobs).
	last *DecodeBatch
}

func (*tokenLoadDecode) Name() string    { return PolicyTokenLoad }
func (*tokenLoadDecode) ColdStart() bool { return false }
func (*tokenLoadDecode) FastPath() bool  { return false }

// podRate is the pod's per-request generation rate: scraped throughput ÷ running requests.
func podRate(p *DecodePod) (float64, bool) {
	if p.HasThroughput && p.Throughput > 0 && p.Running > 0 {
		return p.Throughput / p.Running, true
	}
	return 0, false
}

func (d *tokenLoadDecode) Score(b *DecodeBatch, i int) float64 {
	d.mu.Lock()
	d.last = b
	d.mu.Unlock()
	mean := b.meanRate()
	pod := &b.Pods[i]
	rate, ok := podRate(pod)
	if !ok {
		// The pod has no rate of its own: every rate in the mean is another pod's.
		rate = mean
	}
	return d.tl.Decode.Load(ledger.PodOf(pod.Endpoint), rate, b.Knobs.DecodeTokenLoadOutputGrowth)
}

// Charge implements Charger: the whole prompt on the decode pod, no request cost,
// released when the request completes.
func (d *tokenLoadDecode) Charge(req *request.Request, _, decode *pool.Endpoint) (func(), func()) {
	d.mu.Lock()
	b := d.last
	d.mu.Unlock()
	return d.charge(req, decode, b)
}

// ChargeCycle implements CycleCharger: Charge with the batch the cycle scored.
func (d *tokenLoadDecode) ChargeCycle(cy *picker.Cycle, _, decode *pool.Endpoint) (func(), func()) {
	return d.charge(cy.Req, decode, ScoredDecodeBatch(cy))
}

func (d *tokenLoadDecode) charge(req *request.Request, decode *pool.Endpoint, b *DecodeBatch) (func(), func()) {
	knobs := &d.tl.Gateway
	if b != nil {
		knobs = b.Knobs
	}
	ch := d.tl.Decode.Acquire(ledger.PodOf(decode), float64(req.BodyTokens), knobs.TokenLoadTTL)
	return nil, ch.Release
}

// meanRate is the mean per-request generation rate of the batch's pods that have one,
// computed once per batch (a batch is one request's).
func (b *DecodeBatch) meanRate() float64 {
	return b.Memo("token_load.rate", func() float64 {
		var sum float64
		var n int
		for j := range b.Pods {
			if r, ok := podRate(&b.Pods[j]); ok {
				sum += r
				n++
			}
		}
		if n == 0 {
			return 0
		}
		return sum / float64(n)
	})
}

var (
	_ Charger      = (*tokenLoadPrefill)(nil)
	_ Charger      = (*tokenLoadDecode)(nil)
	_ CycleCharger = (*tokenLoadPrefill)(nil)
	_ CycleCharger = (*tokenLoadDecode)(nil)
)
