package ledger

import (
	"context"
	"time"
)

// JanitorInterval is how often the janitor runs, as the seed says.
const JanitorInterval = time.Minute

// Sweeper is one janitor pass (Prefill, Decode and Sessions implement it, and the latency
// models, which forget lost routes).
type Sweeper interface{ Sweep() }

// RunJanitor calls Sweep on each sweeper every interval (JanitorInterval when ≤ 0) until ctx
// ends. It waits on wall-clock time; a simulation in virtual time calls Sweep itself.
func RunJanitor(ctx context.Context, interval time.Duration, sweepers ...Sweeper) {
	if interval <= 0 {
		interval = JanitorInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, s := range sweepers {
				s.Sweep()
			}
		}
	}
}
