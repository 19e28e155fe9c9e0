package picker

import (
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/proof"
)

// Trace steps of the transfer-proof filter (the lenient policy, internal/proof).
const (
	// StepTransferHeld: a decode pod whose KV transfers keep recomputing was left out
	// ("pd_transfer_held:<endpoint>", at most maxTracedExclusions).
	StepTransferHeld = "pd_transfer_held"
	// StepTransferReadmits: the request could not be served without the held decode pods.
	StepTransferReadmits = "pd_transfer_readmitted"
)

// pickProven runs the pick behind the transfer proof's lenient policy, then passive health:
// decode pods the gate holds (their PD transfers keep recomputing) are no candidates, so their
// requests go to other pairs or the standard path; only when the pick fails without them (503)
// are they readmitted, so the policy never empties a pool.
func (r *Router) pickProven(cands []*pool.Endpoint, pick func([]*pool.Endpoint) (*Decision, error)) (*Decision, error) {
	var held, kept []*pool.Endpoint
	if r.transfer != nil {
		for i, e := range cands {
			if e.Role != pool.RoleDecode || !r.transfer.Held(e.Key()) {
				if held != nil {
					kept = append(kept, e)
				}
				continue
			}
			if held == nil {
				kept = append(make([]*pool.Endpoint, 0, len(cands)-1), cands[:i]...)
			}
			held = append(held, e)
		}
	}
	if len(held) == 0 {
		d, err := r.pickHealthy(cands, pick)
		r.trialStarted(d)
		return d, err
	}
	var d *Decision
	var err error
	readmitted := len(kept) == 0
	if !readmitted {
		d, err = r.pickHealthy(kept, pick)
		readmitted = err != nil && unavailable(err)
	}
	if readmitted {
		d, err = r.pickHealthy(cands, pick)
	}
	if err != nil {
		return nil, err
	}
	r.trialStarted(d)
	if d.Trace == nil {
		d.Trace = &Trace{Candidates: len(cands)}
	}
	for _, e := range held[:min(len(held), maxTracedExclusions)] {
		d.Trace.Add(StepTransferHeld + ":" + e.Key())
	}
	if readmitted {
		d.Trace.Add(StepTransferReadmits)
	}
	return d, nil
}

// trialStarted tells the gate which decode pod a PD decision chose: one on trial (its back-off
// over) takes no more PD work until this request's verdict comes.
func (r *Router) trialStarted(d *Decision) {
	if r.transfer != nil && d != nil && d.Outcome == OutcomePD && len(d.Destination) > 0 {
		r.transfer.TrialStarted(d.Destination[0].Key())
	}
}

// TransferGate is the gate a router's picks honour (nil: none).
func (r *Router) TransferGate() *proof.Gate { return r.transfer }
