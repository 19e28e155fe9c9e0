package prefix

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A busy warmer applies warms in batches: every warm queued is applied in order, without a
// Flush too, and Run returns when its context ends, sleeping between batches or not.
func TestWarmerBatches(t *testing.T) {
	ix := NewIndex(Options{})
	w := NewWarmer(ix, 0)
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{})
	go func() { w.Run(ctx); close(ran) }()
	hs := Hash(nil, strings.Repeat("a prompt of a few blocks ", 8), 16)
	for i := range 200 {
		if !w.Warm("m", hs[:1+i%len(hs)], fmt.Sprintf("e%d", i%7)) {
			t.Fatalf("warm %d dropped with an empty queue", i)
		}
	}
	// The last warm of each endpoint decides its match: all seven reach the whole prompt.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := matches(ix, "m", hs)
		if len(got) == 7 && got["e0"] == 100 && got["e6"] == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("warms not applied without a flush: %v", got)
		}
		time.Sleep(time.Millisecond)
	}
	// Queued behind a batch sleeper, a Flush still sees what was queued before it.
	w.Warm("m", hs, "late")
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := matches(ix, "m", hs); got["late"] != 100 {
		t.Fatalf("after flush: %v", got)
	}
	w.Warm("m", hs, "e0") // busy again, then stopped
	cancel()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
