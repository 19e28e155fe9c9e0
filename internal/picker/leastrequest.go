package picker

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"

	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// LeastRequest picks the endpoint with the fewest requests in flight (as Tandem counts
// them), breaking ties at random, and lists the others as fallbacks in the same order.
type LeastRequest struct {
	Load *load.Tracker
	// Fallbacks is how many fallback endpoints follow the primary (default 2).
	Fallbacks int
}

// Schedule implements Scheduler.
func (l *LeastRequest) Schedule(_ context.Context, req *request.Request, _ *pool.Snapshot, cands []*pool.Endpoint) (*Decision, error) {
	ranked := RankByLoad(l.Load, cands)
	n := l.Fallbacks
	if n == 0 {
		n = 2
	}
	if n+1 < len(ranked) {
		ranked = ranked[:n+1]
	}
	d := &Decision{Strategy: "least-request", Outcome: OutcomeSingle, Step: "least_request",
		Destination: ranked, Trace: &Trace{Candidates: len(cands)}}
	d.Trace.Add("least_request")
	d.Lifecycle = NewInFlight(l.Load, ranked[0])
	return d, nil
}

// RankByLoad orders endpoints by requests in flight, ties broken at random.
func RankByLoad(t *load.Tracker, cands []*pool.Endpoint) []*pool.Endpoint {
	type scored struct {
		e    *pool.Endpoint
		n    int64
		tieb uint32
	}
	s := make([]scored, len(cands))
	for i, e := range cands {
		s[i] = scored{e, t.InFlightOf(e), rand.Uint32()}
	}
	slices.SortFunc(s, func(a, b scored) int {
		if c := cmp.Compare(a.n, b.n); c != 0 {
			return c
		}
		return cmp.Compare(a.tieb, b.tieb)
	})
	out := make([]*pool.Endpoint, len(s))
	for i := range s {
		out[i] = s[i].e
	}
	return out
}

// InFlight is a Lifecycle that counts the request against its endpoint until Done.
type InFlight struct{ done func() }

// NewInFlight starts counting a request on the endpoint.
func NewInFlight(t *load.Tracker, e *pool.Endpoint) *InFlight {
	return &InFlight{done: t.Start(e.Key())}
}

func (f *InFlight) ResponseHeaders(int, *pool.Endpoint) {}
func (f *InFlight) ResponseBody(int, bool)              {}
func (f *InFlight) Done(error)                          { f.done() }
