package pd

import (
	"encoding/json"

	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// TypeCombinedOverflowDecider is step 0b of the seed.
const TypeCombinedOverflowDecider = "combined-overflow-decider"

// CombinedOverflowDecider is step 0b: some combined pod is idle (queue-drain score < 0.25)
// and some PD pod (prefill pods checked first) is saturated (> 1.0), by the seed's
// queue-drain score (waiting + prealloc queues) / max(drain rate, 0.01/s).
type CombinedOverflowDecider struct {
	picker.TypedName
	c *Cascade
}

func (c *Cascade) newCombinedOverflowDecider(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	if err := picker.DecodeParams(raw, nil); err != nil {
		return nil, err
	}
	return &CombinedOverflowDecider{picker.NewTypedName(TypeCombinedOverflowDecider, name), c}, nil
}

// Overflow implements CombinedOverflow.
func (d *CombinedOverflowDecider) Overflow(_ *picker.Cycle, combined []*pool.Endpoint, rolesets []Roleset) bool {
	c := d.c
	idle := false
	for _, e := range combined {
		if c.combinedScore(e) < combinedLowLoadScore {
			idle = true
			break
		}
	}
	if !idle {
		return false
	}
	for _, rs := range rolesets {
		for _, e := range rs.Prefill {
			if c.combinedScore(e) > pdHighLoadScore {
				return true
			}
		}
	}
	for _, rs := range rolesets {
		for _, e := range rs.Decode {
			if c.combinedScore(e) > pdHighLoadScore {
				return true
			}
		}
	}
	return false
}
