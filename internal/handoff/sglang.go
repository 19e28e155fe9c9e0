package handoff

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/wire"
)

// DefaultSGLangBootstrapPort is used when a prefill pod has no bootstrap-port annotation.
const DefaultSGLangBootstrapPort = pool.DefaultSGLangBootstrapPort

var sglangKeys = append([]string{wire.FieldBootstrapHost, wire.FieldBootstrapPort, wire.FieldBootstrapRoom, wire.FieldRID}, prefillKeys...)

// SGLang is the SGLang adapter. Async: SGLang's prefill returns only after the decode pod has
// connected to the bootstrap server, so waiting for it before forwarding decode would deadlock.
// Only top-level keys change; messages, tools and every other byte stay as the client sent them,
// which keeps SGLang's tokenisation and prefix-cache hits stable.
type SGLang struct {
	rids RIDs
}

// Name implements Engine.
func (s *SGLang) Name() string { return "sglang" }

// Prepare implements Engine.
func (s *SGLang) Prepare(_ context.Context, leg *Leg) (*Plan, error) {
	if err := checkControlled(leg.Body, sglangKeys); err != nil {
		return nil, err
	}
	port, err := bootstrapPort(leg.Prefill)
	if err != nil {
		return nil, err
	}
	rid := s.rids.Next(leg.RequestID)
	decode, err := newEdit(leg.Body).
		str(wire.FieldBootstrapHost, leg.Prefill.Address).
		int(wire.FieldBootstrapPort, int64(port)).
		int(wire.FieldBootstrapRoom, rand.Int64N(math.MaxInt64)).
		str(wire.FieldRID, rid).done()
	if err != nil {
		return nil, fmt.Errorf("building the SGLang decode body: %w", err)
	}
	prefill, err := newEdit(decode).prefillOnly(true).done()
	if err != nil {
		return nil, fmt.Errorf("building the SGLang prefill body: %w", err)
	}
	return &Plan{PrefillBody: prefill, DecodeBody: decode, Async: true, RID: rid}, nil
}

// Merge implements Engine: the decode body never waits for the prefill response.
func (s *SGLang) Merge(_ *Leg, plan *Plan, _ []byte) ([]byte, error) { return plan.DecodeBody, nil }

func bootstrapPort(ep *pool.Endpoint) (int, error) {
	port, err := ep.SGLangBootstrapPort()
	if err != nil {
		return 0, badPod(ep, "%v; fix it or remove it to use %d", err, DefaultSGLangBootstrapPort)
	}
	return port, nil
}

// RIDs issues SGLang request ids "<request id>-<8 hex process random><8 hex counter>". SGLang's
// /abort_request matches rids by prefix; the fixed-width suffix keeps any rid from being the
// prefix of another, and makes every attempt unique even when a client reuses its request id.
// The zero value is ready; safe for concurrent use.
type RIDs struct {
	counter atomic.Uint32
}

// processRandom tells this process's rids from another gateway replica's.
var processRandom = rand.Uint32()

// Next returns a fresh rid for the request id (an empty id becomes "tandem").
func (r *RIDs) Next(requestID string) string {
	if requestID == "" {
		requestID = "tandem"
	}
	return fmt.Sprintf("%s-%08x%08x", requestID, processRandom, r.counter.Add(1))
}
