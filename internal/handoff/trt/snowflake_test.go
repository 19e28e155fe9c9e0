package trt

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestComposeLayout(t *testing.T) {
	cases := []struct {
		name             string
		ms, machine, seq int64
		want             int64
	}{
		// (1000<<22) + (5<<12) + 0 = 4194304000 + 20480 = 4194324480; + 2^42 = 4402240835584.
		{"1 s after the epoch, machine 5", 1000, 5, 0, 4402240835584},
		{"next counter value", 1000, 5, 1, 4402240835585},
		{"all zero is the smallest global id", 0, 0, 0, MinGlobalID},
		// All 63 bits set = MaxInt64 ≡ 2^42 (mod MaxInt64 − 2^42); + 2^42 = 2^43.
		{"all fields full folds", 1<<41 - 1, 1023, 4095, 1 << 43},
		{"counter is masked to 12 bits", 1000, 5, 4096, 4402240835584},
		{"machine is masked to 10 bits", 0, 1024, 0, MinGlobalID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Compose(c.ms, c.machine, c.seq); got != c.want {
				t.Errorf("Compose(%d, %d, %d) = %d, want %d", c.ms, c.machine, c.seq, got, c.want)
			}
		})
	}
}

func TestNewIDsValidatesMachineID(t *testing.T) {
	for _, id := range []int{0, 1, 1023} {
		if _, err := NewIDs(id, nil); err != nil {
			t.Errorf("machine id %d refused: %v", id, err)
		}
	}
	for _, id := range []int{-1, 1024, 5000} {
		_, err := NewIDs(id, nil)
		if err == nil || !strings.Contains(err.Error(), "AIBRIX_TRT_MACHINE_ID") {
			t.Errorf("machine id %d: err = %v, want one naming AIBRIX_TRT_MACHINE_ID", id, err)
		}
	}
}

func TestIDsFieldsAndUniqueness(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ids, err := NewIDs(77, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	ms := now.UnixMilli() - Epoch
	first := ids.Next()
	raw := first - MinGlobalID // no fold for today's timestamps
	if raw>>22 != ms || (raw>>12)&1023 != 77 || raw&4095 != 0 {
		t.Errorf("id %d decodes to ms=%d machine=%d seq=%d, want %d 77 0", first, raw>>22, (raw>>12)&1023, raw&4095, ms)
	}
	if first <= 1<<53 {
		t.Errorf("id %d fits a float64 exactly; the tests of exact copying would prove nothing", first)
	}
	// 4096 ids in one millisecond are distinct; concurrently issued too.
	var mu sync.Mutex
	seen := map[int64]bool{first: true}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1023; i++ {
				id := ids.Next()
				mu.Lock()
				seen[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != 4093 {
		t.Errorf("%d distinct ids, want 4093", len(seen))
	}
	for id := range seen {
		if id < MinGlobalID || id == math.MaxInt64 {
			t.Fatalf("id %d out of range", id)
		}
	}
}
