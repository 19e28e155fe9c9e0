package main

import (
	"github.com/tandem-epp/tandem/internal/load"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

func newScheduler(*pool.Store) picker.Scheduler {
	return &picker.LeastRequest{Load: load.NewTracker()}
}
