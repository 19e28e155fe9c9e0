package pd

import (
	"context"
	"encoding/json"

	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
)

// TypeBucketFilter is step 0 of the seed, prompt-length bucketing.
const TypeBucketFilter = "prompt-length-bucket-filter"

// BucketFilter keeps, when bucketing is on for the request (AIBRIX_PROMPT_LENGTH_BUCKETING,
// or the profile's promptLengthBucketing), the pods whose routingConfig range
// [promptLenBucketMinLength, promptLenBucketMaxLength] covers the prompt (0 max: unlimited;
// no annotation: any length). With bucketing off it keeps every pod.
type BucketFilter struct{ picker.TypedName }

// NewBucketFilter returns the filter.
func NewBucketFilter() *BucketFilter { return &BucketFilter{picker.NewTypedName(TypeBucketFilter, "")} }

func newBucketFilter(name string, raw json.RawMessage, _ *picker.Handle) (picker.Plugin, error) {
	if err := picker.DecodeParams(raw, nil); err != nil {
		return nil, err
	}
	return &BucketFilter{picker.NewTypedName(TypeBucketFilter, name)}, nil
}

// Filter implements picker.Filter.
func (f *BucketFilter) Filter(_ context.Context, cy *picker.Cycle, eps []*pool.Endpoint) []*pool.Endpoint {
	if !cy.Resolved.PD.PromptLengthBucketing || cy.PodRouting == nil {
		return eps
	}
	n := cy.Req.PromptTokens
	return keepIf(eps, func(e *pool.Endpoint) bool { return cy.PodRouting(e).Covers(n) })
}
