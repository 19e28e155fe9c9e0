package prefix

import "context"

// Warmer applies Index.Add off the request path: the picker hands it the prompt's hashes
// and the chosen endpoint and returns at once. When its queue is full a warm is dropped
// (the next request of the same prefix warms it again); routing never waits for it.
type Warmer struct {
	ix *Index
	ch chan warm
}

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
	return &Warmer{ix: ix, ch: make(chan warm, capacity)}
}

// Run applies queued warms until ctx ends.
func (w *Warmer) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case x := <-w.ch:
			if x.done != nil {
				close(x.done)
				continue
			}
			ix := x.ix
			if ix == nil {
				ix = w.ix
			}
			ix.AddCapped(x.model, x.hashes, x.key, x.capacity)
		}
	}
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
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
