package main

import (
	"context"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// newScheduler is the production router with the default configuration: on a pool without
// prefill/decode roles it resolves to least-request.
func newScheduler(*pool.Store) picker.Scheduler {
	r, deps, err := app.BuildRouter(config.DefaultGateway(), nil, picker.NewRegistry(), nil, logr.Discard())
	if err != nil {
		fail(err)
	}
	go deps.Warmer.Run(context.Background())
	return r
}
