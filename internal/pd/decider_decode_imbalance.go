package pd

import (
	"encoding/json"
	"math"

	"github.com/tandem-epp/tandem/internal/picker"
)

// TypeDecodeImbalanceDecider is step 2 of the seed.
const TypeDecodeImbalanceDecider = "decode-imbalance-decider"

// DecodeImbalanceDecider is step 2: three ordered checks over the decode candidates, the
// first that fires names the pod (thresholds from the request's profile):
//  1. running + pending spread ≥ AIBRIX_DECODE_LOAD_IMBALANCE_MIN_SPREAD among pods with the
//     running metric → the least-loaded of them;
//  2. throughput spread > AIBRIX_DECODE_THROUGHPUT_IMBALANCE_MIN_SPREAD among pods exporting
//     it → the lowest-throughput pod;
//  3. every pod draining (rate > 0): requests/max(rate, 0.1), max/min ratio >
//     AIBRIX_DECODE_SCORE_RATIO_THRESHOLD (and min > 0) → the lowest ratio.
//
// Pods without a metric are left out of that metric's spread. Ties go at random.
type DecodeImbalanceDecider struct{ picker.TypedName }

func newDecodeImbalanceDecider(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	if err := picker.DecodeParams(raw, nil); err != nil {
		return nil, err
	}
	return &DecodeImbalanceDecider{picker.NewTypedName(TypeDecodeImbalanceDecider, name)}, nil
}

// DecodeFastPath implements DecodeFastPath.
func (d *DecodeImbalanceDecider) DecodeFastPath(cy *picker.Cycle, b *DecodeBatch) (int, string) {
	k := b.Knobs
	rnd := cy.RandN
	reqMin, reqMax, reqPick, reqSeen := math.Inf(1), math.Inf(-1), -1, 0
	thrMin, thrMax, thrPick, thrSeen := math.Inf(1), math.Inf(-1), -1, 0
	for i := range b.Pods {
		p := &b.Pods[i]
		if p.HasRunning {
			r := p.Requests()
			reqMax = math.Max(reqMax, r)
			reqPick, reqSeen, reqMin = minPick(rnd, r, reqMin, i, reqPick, reqSeen)
		}
		if p.HasThroughput {
			thrMax = math.Max(thrMax, p.Throughput)
			thrPick, thrSeen, thrMin = minPick(rnd, p.Throughput, thrMin, i, thrPick, thrSeen)
		}
	}
	if reqPick >= 0 && reqMax-reqMin >= k.DecodeLoadImbalanceMinSpread {
		return reqPick, StepDecodeRequests
	}
	if thrPick >= 0 && thrMax-thrMin > k.DecodeThroughputImbalanceMinSpread {
		return thrPick, StepDecodeThroughput
	}
	scMin, scMax, scPick, scSeen := math.Inf(1), 0.0, -1, 0
	for i := range b.Pods {
		p := &b.Pods[i]
		if !(p.Drain > 0) {
			return -1, ""
		}
		sc := p.Requests() / math.Max(p.Drain, drainRatioFloor)
		scMax = math.Max(scMax, sc)
		scPick, scSeen, scMin = minPick(rnd, sc, scMin, i, scPick, scSeen)
	}
	if scPick >= 0 && scMin > 0 && scMax/scMin > k.DecodeScoreRatioThreshold {
		return scPick, StepDecodeDrain
	}
	return -1, ""
}
