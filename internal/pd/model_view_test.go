package pd

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/request"
)

// In a pool of two models, a pick over a model's view of the snapshot (what the ext_proc
// server hands the picker) pairs only that model's pods, and the view's sorting by role is
// made once per snapshot, like the whole snapshot's.
func TestPicksOverAModelsView(t *testing.T) {
	other := map[string]string{pool.LabelModelName: "other"}
	h := newHarness(t, gateway(nil), P("pA", "A"), D("dA", "A"),
		pod{name: "pB", role: "prefill", roleset: "B", labels: other}, pod{name: "dB", role: "decode", roleset: "B", labels: other})
	snap := h.store.Load()
	for _, model := range []string{"m", "other"} {
		view := snap.OfModel(model)
		if len(view) != 2 {
			t.Fatalf("%s: view %v", model, names(view))
		}
		for range 3 {
			body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt("x", 8)})
			req, err := request.Parse("POST", "/v1/completions", map[string]string{}, body)
			if err != nil {
				t.Fatal(err)
			}
			d, err := h.router.Schedule(context.Background(), req, snap, view)
			if err != nil {
				t.Fatal(err)
			}
			if d.Prefill[0].Model != model || d.Destination[0].Model != model {
				t.Fatalf("%s: picked %s/%s", model, first(d.Prefill), first(d.Destination))
			}
			d.Lifecycle.Done(nil)
		}
	}
	rh := h.c.newRolesetHandlerOf("", ProfilePrefill, ProfileDecode, ProfileCombined, 0)
	sortOf := func(cands []*pool.Endpoint) *sortedRoles {
		return rh.sorted(&picker.Cycle{Snap: snap, Candidates: cands})
	}
	m, o := snap.OfModel("m"), snap.OfModel("other")
	if a, b := sortOf(m), sortOf(m); a != b || a.snap != snap || len(a.prefill) != 1 || a.prefill[0].Model != "m" {
		t.Errorf("model m's view sorted %p then %p (prefill %v): want one sorting, kept", a, b, names(a.prefill))
	}
	if a, b := sortOf(o), sortOf(o); a != b || a == sortOf(m) {
		t.Error("model other's view was not kept apart from m's")
	}
	if c := slices.Clone(m); sortOf(c).snap != nil || sortOf(c) == sortOf(m) {
		t.Error("a slice the snapshot does not own was kept with it")
	}
}
