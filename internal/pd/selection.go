package pd

import (
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// selection is one request's pass through the PD chain, in the cycle's state (never in a
// plugin): what the roleset handler sorted out before the critical section, the batches its
// first round built, the costs the policy scorers wrote, and the pair.
type selection struct {
	nonInference bool
	policies     *policies // resolved once per cycle, by the handler's producer
	pols         policies  // what policies points to
	split        roleSplit // the candidates by role, for the profiles' role filters
	knobs        *config.PD
	promptTokens int
	prefPol      PrefillPolicy
	decPol       DecodePolicy
	pt           partition
	trace        *picker.Trace
	match        map[string]float64 // endpoint key -> prefix match %, from the prefill scorer
	hashes       []uint64
	fastSteps    []string
	overflow     bool // step 0b chose a combined pod

	// The predictive plugins' view (predictive: the request's policies or the handler's
	// placement deciders predict): its objectives, and whether step 5 adds raw costs.
	predictive bool
	absolute   bool
	obj        Objective

	// The scoring round (steps 3–5): the candidates left after the fast paths, each with
	// its roleset index, and the costs the scorers wrote (NaN: not scored).
	rounds         int
	pb             *PrefillBatch
	prefillEPs     []*pool.Endpoint // pb's endpoints, the prefill profile's input
	preRS          []int
	b              *DecodeBatch
	decRS          []int
	prefCost       []float64
	decCost        []float64
	relaxed        bool // the standard-deviation skip is lifted (it left no pair)
	ri             int
	bestP, bestD   []int
	scoreP, scoreD []float64
	decMax         float64
	finals         []rolesetFinal
	// topo is the topology labels when the candidates' placements differ (else zero), and
	// pairDist the chosen pair's distance class under them.
	topo     config.TopologyLabels
	pairDist int
}

// distance is the chosen pair's distance class, -1 when topology is off for the pick.
func (s *selection) distance() int {
	if s.topo.Len() == 0 {
		return -1
	}
	return s.pairDist
}

var selectionKey = picker.NewStateKey[*selection]("pd.selection")

// recycle returns the batches' forecasts once the Result is made (options copy what they
// predicted; none outlives the Result).
func (s *selection) recycle() {
	if s.pb != nil {
		recycleForecasts(s.pb.fc)
		s.pb.fc = nil
	}
	if s.b != nil {
		recycleForecasts(s.b.fc)
		s.b.fc = nil
	}
}

// selectionOf is the request's selection, nil outside a roleset handler's cycle.
func selectionOf(cy *picker.Cycle) *selection {
	s, _ := selectionKey.Read(cy.State)
	return s
}

// scoring reports whether the roleset handler's scoring round is under way: the policy
// scorers then score its batches, and the scoring-only filters apply.
func (s *selection) scoring() bool { return s != nil && s.pb != nil }

// The batches a policy scorer scored, for a Charger to read (CycleCharger).
var (
	prefillBatchKey = picker.NewStateKey[*PrefillBatch]("pd.prefill-batch")
	decodeBatchKey  = picker.NewStateKey[*DecodeBatch]("pd.decode-batch")
)

// ScoredPrefillBatch is the prefill batch the request's prefill policy scored, nil when
// none did.
func ScoredPrefillBatch(cy *picker.Cycle) *PrefillBatch {
	if s := selectionOf(cy); s.scoring() {
		return s.pb
	}
	b, _ := prefillBatchKey.Read(cy.State)
	return b
}

// ScoredDecodeBatch is the decode batch the request's decode policy scored, nil when none did.
func ScoredDecodeBatch(cy *picker.Cycle) *DecodeBatch {
	if s := selectionOf(cy); s.scoring() {
		return s.b
	}
	b, _ := decodeBatchKey.Read(cy.State)
	return b
}
