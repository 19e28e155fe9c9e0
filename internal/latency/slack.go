package latency

import (
	"container/heap"
	"math"
	"slices"
)

// decodeSlack is the TPOT slack of the requests decoding on a pod. A prompt prefilled on a
// pod that is decoding stalls every decode there for about its prefill time (an iteration
// carrying a large chunk is as long as the chunk's compute). A request of o output tokens
// with TPOT objective T, decoding at step τ, absorbs (T − τ)·(o − 1) seconds of stalls before
// its mean TPOT exceeds T: short outputs absorb little. Each decoding request's budget is kept
// as budget + the pod's cumulative stall when it started decoding, so the pod's tightest
// budget now is the least such key minus the cumulative stall since.
type decodeSlack struct {
	// stallCum is the stall (seconds) prompts prefilled here imposed on its decodes so far;
	// budgets the stall budgets of the requests decoding here.
	stallCum float64
	budgets  slackHeap
}

// slackHeap is the decoding requests' stall budgets, the tightest first.
type slackHeap []slackEntry

type slackEntry struct {
	key float64
	// life is the request's: its budget stands until the request ends. (A pointer, so that a
	// forecast reads it without looking the request up; not the route, which an entry would
	// keep alive.)
	life *routeLife
}

// routeLife says whether a routed request still runs.
type routeLife struct{ gone bool }

func (h slackHeap) Len() int           { return len(h) }
func (h slackHeap) Less(i, j int) bool { return h[i].key < h[j].key }
func (h slackHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *slackHeap) Push(x any)        { *h = append(*h, x.(slackEntry)) }
func (h *slackHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// defaultOutputTokens is assumed for a request that sets no max_tokens.
const defaultOutputTokens = 256

// stall adds s seconds a prompt prefilled on the pod stalls its decodes.
func (d *decodeSlack) stall(s float64) { d.stallCum += s }

// willDecode gives a request routed to decode here its stall budget, from its pick: every
// prompt booked on the pod after it runs after its own prefill (the pod serves in order),
// so it stalls its decode. requests is how many requests Tandem has on the pod.
func (d *decodeSlack) willDecode(life *routeLife, objective, tpot float64, maxTokens, requests int) {
	if !(objective > 0) {
		return
	}
	if maxTokens <= 0 {
		maxTokens = defaultOutputTokens
	}
	budget := math.Max(objective-tpot, 0) * float64(max(maxTokens-1, 1))
	if n := len(d.budgets); n >= 64 && n > 4*requests {
		// Ended requests' entries wait below a long-lived tight budget: drop them.
		d.budgets = slices.DeleteFunc(d.budgets, func(e slackEntry) bool { return e.life.gone })
		heap.Init(&d.budgets)
	}
	heap.Push(&d.budgets, slackEntry{key: budget + d.stallCum, life: life})
}

// room is the tightest stall budget left among the requests decoding on the pod (+Inf when
// none).
func (d *decodeSlack) room() float64 {
	for d.budgets.Len() > 0 && d.budgets[0].life.gone {
		heap.Pop(&d.budgets)
	}
	if d.budgets.Len() == 0 {
		return math.Inf(1)
	}
	return d.budgets[0].key - d.stallCum
}
