package pd

import (
	"sync"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// ledgerPolicy is a stand-in for the next issue's token_load: it scores prefill pods by its
// own ledger of prompt tokens, charged in the selection critical section.
type ledgerPolicy struct {
	mu     sync.Mutex
	tokens map[string]int
	done   int
}

func (*ledgerPolicy) Name() string     { return "ledger" }
func (*ledgerPolicy) UsesPrefix() bool { return false }
func (l *ledgerPolicy) Score(b *PrefillBatch, i int) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return float64(l.tokens[b.Pods[i].Endpoint.Key()])
}

func (l *ledgerPolicy) Charge(req *request.Request, prefill, _ *pool.Endpoint) (func(), func()) {
	k, n := prefill.Key(), req.PromptTokens
	l.mu.Lock()
	l.tokens[k] += n
	l.mu.Unlock()
	return func() {
			l.mu.Lock()
			l.tokens[k] -= n
			l.mu.Unlock()
		}, func() {
			l.mu.Lock()
			l.done++
			l.mu.Unlock()
		}
}

func TestChargerExtensionPoint(t *testing.T) {
	gw := gateway(func(g *config.PD) {
		g.PrefillScorePolicy = "ledger"
		g.DecodeScorePolicy = PolicyLeastRequest
	})
	names := config.DefaultNames()
	names.PrefillPolicies = append(names.PrefillPolicies, "ledger")
	h := newHarnessNames(t, gw, names, P("p0", "0"), D("d0", "0"), P("p1", "1"), D("d1", "1"))
	led := &ledgerPolicy{tokens: map[string]int{}}
	h.c.Policies().RegisterPrefill(led)

	// 40 concurrent picks of 100-token prompts with no release: the ledger splits 2000/2000.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ds []*picker.Decision
	for range 40 {
		wg.Go(func() {
			d := h.mustPick(prompt("x", 100))
			mu.Lock()
			ds = append(ds, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	if led.tokens[h.key("p0")] != 2000 || led.tokens[h.key("p1")] != 2000 {
		t.Fatalf("ledger %v, want 2000 each", led.tokens)
	}
	ds[0].Lifecycle.ResponseHeaders(200, nil)
	ds[0].Lifecycle.ResponseHeaders(200, nil)
	if sum := led.tokens[h.key("p0")] + led.tokens[h.key("p1")]; sum != 3900 {
		t.Fatalf("prefill release: %d left, want 3900", sum)
	}
	for _, d := range ds {
		d.Lifecycle.Done(nil)
		d.Lifecycle.Done(nil)
	}
	if led.tokens[h.key("p0")] != 0 || led.tokens[h.key("p1")] != 0 || led.done != 40 {
		t.Fatalf("after done: %v, %d completions", led.tokens, led.done)
	}
}
