package prefix

import (
	"context"
	"time"
)

// Warmer applies Index.Add off the request path: the picker hands it the prompt's hashes
// and the chosen endpoint and returns at once. When its queue is full a warm is dropped
// (the next request of the same prefix warms it again); routing never waits for it.
//
// While warms keep coming it applies them in batches, one batch per batchPeriod: a warm
// queued while the warmer sleeps on its timer wakes nobody, where one queued to a warmer
// parked on its queue has the picking goroutine wake it (a futex call, microseconds on a
// virtual machine, on every pick). The first warm after an idle spell still wakes it at once.
// An engine holds a prompt's blocks only once its prefill has run, milliseconds at least,
// so a warm applied within a period is still early.
type Warmer struct {
	ix   *Index
	ch   chan warm
	kick chan struct{} // Flush's wake-up of a warmer sleeping between batches
}

// batchPeriod is how long a busy warmer sleeps between batches.
const batchPeriod = time.Millisecond

type warm struct {
	ix       *Index // nil: the warmer's own index
	capacity int    // AddCapped's bound
	model    string
	hashes   []uint64
	key      string
	done     chan struct{} // a Flush barrier when non-nil
}

// NewWarmer returns a warmer with a queue of capacity warms (1024 when <= 0).
// Nothing is applied until Run is called.
func NewWarmer(ix *Index, capacity int) *Warmer {
	if capacity <= 0 {
		capacity = 1024
	}
	return &Warmer{ix: ix, ch: make(chan warm, capacity), kick: make(chan struct{}, 1)}
}

// Run applies queued warms until ctx ends.
func (w *Warmer) Run(ctx context.Context) {
	timer := time.NewTimer(batchPeriod)
	timer.Stop()
	for {
		// Idle: parked on the queue, the first warm wakes it.
		select {
		case <-ctx.Done():
			return
		case x := <-w.ch:
			w.apply(x)
		}
		// Busy: a batch per period, until a period brings nothing.
		for {
			timer.Reset(batchPeriod)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			case <-w.kick:
				timer.Stop()
			}
			if w.drain() == 0 {
				break
			}
		}
	}
}

// drain applies the warms queued so far and returns how many there were.
func (w *Warmer) drain() int {
	for n := 0; ; n++ {
		select {
		case x := <-w.ch:
			w.apply(x)
		default:
			return n
		}
	}
}

func (w *Warmer) apply(x warm) {
	if x.done != nil {
		close(x.done)
		return
	}
	ix := x.ix
	if ix == nil {
		ix = w.ix
	}
	ix.AddCapped(x.model, x.hashes, x.key, x.capacity)
}

// Warm queues Add(model, hashes, key). The hashes slice must not be modified afterwards.
// It reports false when the queue was full and the warm was dropped.
func (w *Warmer) Warm(model string, hashes []uint64, key string) bool {
	return w.WarmInto(nil, model, hashes, key, 0)
}

// WarmInto queues ix.AddCapped(model, hashes, key, capacity) (the warmer's own index when
// ix is nil): one warmer serves every index of the process.
func (w *Warmer) WarmInto(ix *Index, model string, hashes []uint64, key string, capacity int) bool {
	select {
	case w.ch <- warm{ix: ix, capacity: capacity, model: model, hashes: hashes, key: key}:
		return true
	default:
		return false
	}
}

// Flush waits until every warm queued before it has been applied, or ctx ends.
// Run must be running.
func (w *Warmer) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case w.ch <- warm{done: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select { // a warmer sleeping between batches takes its next one now
	case w.kick <- struct{}{}:
	default:
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
