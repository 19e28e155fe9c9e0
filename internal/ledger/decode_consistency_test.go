package ledger_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/ledger"
	"github.com/tandem-epp/tandem/internal/load"
)

// A decode score read while another goroutine releases a charge must see the ledger before
// or after the release, never half of it. Worked by hand: the ledger starts at t0 (its
// base); charge A (100 tokens) is made at t0, then the clock moves to t0+10000 s and a
// churning goroutine repeatedly charges B (100 tokens, routed now) and releases it. With
// rate 1 token/s a consistent read is either
//
//	A only:  100 + 1·(10000 − 0)                   = 10100, or
//	A and B: 200 + 1·((10000 − 0) + (10000 − 10000)) = 10200.
//
// A torn read (count taken before B's release, Σ routed_at after it) gives
// 2·10000 − 0 = 20000 s of elapsed time: 20100 or 20200, i.e. one phantom "uptime" of
// output on the pod, enough to lose it the pick.
func TestDecodeLoadReadIsConsistent(t *testing.T) {
	clock := load.NewManualClock(t0)
	l := ledger.NewDecode(ledger.Options{Clock: clock})
	p := ledger.Pod{Namespace: "ns", Name: "d"}
	l.Acquire(p, 100, 0)
	clock.Advance(10000 * time.Second)

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			l.Acquire(p, 100, 0).Release()
		}
	}()
	deadline := time.Now().Add(time.Second)
	bad := 0
	var sample float64
	for i := 0; i < 100000 && time.Now().Before(deadline); i++ {
		got := l.Load(p, 1, true)
		if got != 10100 && got != 10200 {
			bad++
			sample = got
		}
	}
	stop.Store(true)
	wg.Wait()
	if bad > 0 {
		t.Fatalf("%d torn reads of the decode ledger, e.g. %v; want 10100 or 10200 every time", bad, sample)
	}
}
