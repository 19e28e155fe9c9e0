package sim

import (
	"context"
	"errors"
	"testing"
)

func waitEngine(t *testing.T, e *engine, cond func(Stats) bool) {
	t.Helper()
	ctx := testCtx(t)
	for {
		ch := e.watch()
		if cond(e.stats()) {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("engine never reached the state; last %+v", e.stats())
		}
	}
}

// admitAsync admits in a goroutine and reports the admission on the returned channel.
func admitAsync(ctx context.Context, e *engine, need int) <-chan *admission {
	ch := make(chan *admission, 1)
	go func() {
		a, _ := e.admit(ctx, need)
		ch <- a
	}()
	return ch
}

func TestAdmitQueuesFIFOAtMaxRunning(t *testing.T) {
	p := DefaultParams()
	p.MaxRunning = 2
	e := newEngine(p)
	ctx := testCtx(t)
	a, _ := e.admit(ctx, 10)
	b, _ := e.admit(ctx, 10)
	c := admitAsync(ctx, e, 10)
	waitEngine(t, e, func(s Stats) bool { return s.Waiting == 1 })
	d := admitAsync(ctx, e, 10)
	waitEngine(t, e, func(s Stats) bool { return s.Waiting == 2 })
	if st := e.stats(); st.Running != 2 || st.KVUsedTokens != 20 {
		t.Fatalf("running %d kv %d, want 2 and 20", st.Running, st.KVUsedTokens)
	}
	a.release()
	ca := <-c // c queued first, so c runs first
	waitEngine(t, e, func(s Stats) bool { return s.Running == 2 && s.Waiting == 1 })
	b.release()
	da := <-d
	ca.release()
	da.release()
	a.release() // a second release changes nothing
	if st := e.stats(); st.Running != 0 || st.KVUsedTokens != 0 || st.Waiting != 0 {
		t.Fatalf("after releases: %+v", st)
	}
}

func TestAdmitWaitsForKVHeadOfLine(t *testing.T) {
	p := DefaultParams()
	p.KVTokens = 100
	e := newEngine(p)
	ctx := testCtx(t)
	a, _ := e.admit(ctx, 60)
	big := admitAsync(ctx, e, 50) // 60+50 > 100: waits
	waitEngine(t, e, func(s Stats) bool { return s.Waiting == 1 })
	small := admitAsync(ctx, e, 10) // would fit, but FIFO keeps it behind the head
	waitEngine(t, e, func(s Stats) bool { return s.Waiting == 2 })
	a.release()
	(<-big).release()
	(<-small).release()
	if st := e.stats(); st.KVUsedTokens != 0 {
		t.Fatalf("kv %d after releases", st.KVUsedTokens)
	}
}

func TestAdmitCancelledLeavesQueue(t *testing.T) {
	p := DefaultParams()
	p.MaxRunning = 1
	e := newEngine(p)
	a, _ := e.admit(testCtx(t), 1)
	ctx, cancel := context.WithCancelCause(testCtx(t))
	errc := make(chan error, 1)
	go func() { _, err := e.admit(ctx, 1); errc <- err }()
	waitEngine(t, e, func(s Stats) bool { return s.Waiting == 1 })
	cancel(errAborted)
	if err := <-errc; !errors.Is(err, errAborted) {
		t.Fatalf("admit error %v, want the cancel cause", err)
	}
	if st := e.stats(); st.Waiting != 0 || st.Running != 1 {
		t.Fatalf("after cancel: %+v", st)
	}
	a.release()
}

func TestKeepHoldsKVAfterTheBatch(t *testing.T) {
	e := newEngine(DefaultParams())
	a, _ := e.admit(testCtx(t), 100)
	free := a.keep()
	a.release() // no effect: the KV now belongs to free
	if st := e.stats(); st.Running != 0 || st.KVUsedTokens != 100 {
		t.Fatalf("after keep: %+v, want running 0 and 100 tokens held", st)
	}
	free()
	free()
	if st := e.stats(); st.KVUsedTokens != 0 {
		t.Fatalf("after free: %+v", st)
	}
}

func TestPrefillLanesSerializePrefills(t *testing.T) {
	p := DefaultParams() // one lane
	e := newEngine(p)
	release, err := e.prefillLane(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	// With the lane held, a second prefill cannot start: only its (ended) context is ready.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.prefillLane(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("second prefill while the lane is held: %v, want it to wait (and give up)", err)
	}
	release()
	second, err := e.prefillLane(testCtx(t))
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	second()

	p.PrefillLanes = 2
	e = newEngine(p)
	r1, _ := e.prefillLane(testCtx(t))
	r2, err := e.prefillLane(testCtx(t))
	if err != nil {
		t.Fatalf("two lanes hold two prefills: %v", err)
	}
	r1()
	r2()
}
