package pd

import (
	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
)

// Strategies returns every routing strategy Tandem ships, sharing deps: the PD cascade
// plus random, least-request and prefix-cache. Hand them to picker.NewRouter.
func Strategies(c *Cascade, deps *picker.Deps, gateway config.PD) []picker.Strategy {
	return []picker.Strategy{
		c,
		picker.NewRandom(deps),
		picker.NewLeastRequestStrategy(deps),
		picker.NewPrefixCache(deps, gateway),
	}
}
