package pool

import (
	"fmt"
	"testing"
)

func modelPool(n int, models ...string) *Snapshot {
	eps := make([]*Endpoint, n)
	for i := range eps {
		var labels map[string]string
		if m := models[i%len(models)]; m != "" {
			labels = map[string]string{LabelModelName: m}
		}
		eps[i] = NewEndpoint("ns", fmt.Sprintf("pod-%04d", i), fmt.Sprintf("10.0.%d.%d", i/250, 1+i%250), 8000, 0, labels, nil)
	}
	return NewStore().Publish(Info{Name: "p"}, eps, true)
}

func views(s *Snapshot) int {
	n := 0
	s.models.Range(func(any, any) bool { n++; return true })
	return n
}

// A model some pod is labelled with gets its view made once, the whole pool when only its pods
// are there; a name no pod carries (a LoRA adapter, a client's typo) reaches every pod and is
// not remembered, so clients cannot grow the snapshot.
func TestModelViewsMadeOnceForLabelledModels(t *testing.T) {
	one := modelPool(8, "m")
	if a := one.OfModel("m"); &a[0] != &one.Endpoints[0] || len(a) != 8 || views(one) != 1 {
		t.Fatalf("single-model pool: view of %d endpoints, %d remembered; want the pool itself, remembered once", len(a), views(one))
	}
	for i := range 100 {
		if a := one.OfModel(fmt.Sprintf("adapter-%d", i)); &a[0] != &one.Endpoints[0] {
			t.Fatal("an unlabelled model's view is not the whole pool")
		}
	}
	if views(one) != 1 {
		t.Fatalf("%d views remembered after 100 unlabelled names; want 1", views(one))
	}
	none := modelPool(8, "") // a plain GIE pool: no model labels
	if a := none.OfModel("m"); &a[0] != &none.Endpoints[0] || views(none) != 0 {
		t.Fatalf("unlabelled pool: not the pool itself, or %d views remembered", views(none))
	}
	two := modelPool(8, "a", "b")
	if a, b := two.OfModel("a"), two.OfModel("a"); len(a) != 4 || &a[0] != &b[0] || !two.Owns(a) {
		t.Fatalf("two-model pool: view of %d endpoints, made twice or not owned", len(a))
	}
}

// BenchmarkOfModel is the per-request cost of narrowing the pool to the request's model.
func BenchmarkOfModel(b *testing.B) {
	for _, tc := range []struct {
		name   string
		models []string
	}{{"one-model-1024", []string{"m"}}, {"four-models-1024", []string{"m", "x", "y", "z"}}, {"unlabelled-1024", []string{""}}} {
		s := modelPool(1024, tc.models...)
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if len(s.OfModel("m")) == 0 {
					b.Fatal("empty view")
				}
			}
		})
	}
}
