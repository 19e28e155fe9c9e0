package picker

import (
	"context"
	"encoding/json"
	"fmt"
)

// TypeSingleProfileHandler is the profile handler of GIE and llm-d for one profile.
const TypeSingleProfileHandler = "single-profile-handler"

// SingleProfileHandler runs the one profile it is given; the result is that profile's ranking.
type SingleProfileHandler struct{ TypedName }

// NewSingleProfileHandler returns the handler.
func NewSingleProfileHandler() *SingleProfileHandler {
	return &SingleProfileHandler{NewTypedName(TypeSingleProfileHandler, "")}
}

func newSingleProfileHandler(name string, raw json.RawMessage, _ *Handle) (Plugin, error) {
	if err := DecodeParams(raw, nil); err != nil {
		return nil, err
	}
	return &SingleProfileHandler{NewTypedName(TypeSingleProfileHandler, name)}, nil
}

// Next implements ProfileHandler.
func (h *SingleProfileHandler) Next(_ context.Context, _ *Cycle, profiles []*Profile, done map[string]*ProfileResult) []ProfileRun {
	if len(done) > 0 || len(profiles) == 0 {
		return nil
	}
	return []ProfileRun{{Profile: profiles[0]}}
}

// Result implements ProfileHandler.
func (h *SingleProfileHandler) Result(_ context.Context, _ *Cycle, done map[string]*ProfileResult) (*Decision, error) {
	for _, r := range done {
		return &Decision{Destination: r.Ranked}, nil
	}
	return nil, fmt.Errorf("no profile ran")
}
