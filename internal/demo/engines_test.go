package demo

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/sim"
)

// TestCheckEnginesWithTandem runs the demo's engine check against Tandem in-process: each
// engine's pair answers every request from the decode pod with KV from the prefill pod, the
// prefill legs sent by Tandem itself (the pools ask for the epp hand-off).
func TestCheckEnginesWithTandem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	run := func(ctx context.Context, args []string) error { return app.Run(ctx, args, io.Discard) }
	results := CheckEngines(ctx, run, 0.01, logr.Discard())
	var out bytes.Buffer
	if err := ReportEngines(&out, results); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	if len(results) != 3 {
		t.Fatalf("%d engines checked, want 3", len(results))
	}
	for _, r := range results {
		want := 0
		for _, q := range engineRequests {
			if !q.vllmOnly || r.Engine == sim.EngineVLLM {
				want++
			}
		}
		if r.Requests != want || r.PD != r.Requests || r.PrefillLegs != r.Requests {
			t.Errorf("%+v", r)
		}
	}
	if n := strings.Count(out.String(), "  ok\n"); n != 3 {
		t.Errorf("%d engines ok in the report, want 3:\n%s", n, out.String())
	}
}
