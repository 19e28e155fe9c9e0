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
	n := bucketLength(cy, eps)
	return keepIf(eps, func(e *pool.Endpoint) bool { return cy.PodRouting(e).Covers(n) })
}

// BucketLength is the prompt length bucketing compares with the ranges of the request's
// candidates (see bucketLength), for code outside the chain that buckets the same way.
func BucketLength(cy *picker.Cycle) int { return bucketLength(cy, cy.Candidates) }

var bucketLengthKey = picker.NewStateKey[int]("pd.bucketLength")

// bucketLength is the prompt length bucketing compares with the ranges the request's candidates
// declare (all of them, whichever profile asks first: every profile must see one length): the
// cl100k_base token count, as AIBrix counts it, made only when a range's boundary is near the
// bytes/4 estimate (and no further than the largest such boundary), else the estimate. Worked
// out once per cycle; the combined fallback and bucket serving read the same value.
func bucketLength(cy *picker.Cycle, eps []*pool.Endpoint) int {
	if n, ok := bucketLengthKey.Read(cy.State); ok {
		return n
	}
	n := cy.Req.PromptTokens
	if l := cy.Req.PromptLength; l != nil && cy.PodRouting != nil {
		p := l.Probe()
		all := cy.Candidates
		if len(all) == 0 {
			all = eps
		}
		for _, e := range all {
			rc := cy.PodRouting(e)
			p.Boundary(rc.PromptLenBucketMinLength) // n >= min
			if rc.PromptLenBucketMaxLength > 0 {
				p.Boundary(rc.PromptLenBucketMaxLength + 1) // n <= max
			}
		}
		n, _ = p.Tokens()
	}
	if cy.State != nil {
		bucketLengthKey.Write(cy.State, n)
	}
	return n
}

// promptLength is the length bucketing used for this cycle, else the estimate.
func promptLength(cy *picker.Cycle) int {
	if n, ok := bucketLengthKey.Read(cy.State); ok {
		return n
	}
	return cy.Req.PromptTokens
}
