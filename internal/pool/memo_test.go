package pool

import (
	"sync"
	"testing"
)

var testMemo = NewMemo()

func TestMemoKeepsEachOwnersValueAtItsGeneration(t *testing.T) {
	e := NewEndpoint("ns", "pod", "10.0.0.1", 8000, 0, nil, nil)
	owners := []*int{new(int), new(int), new(int), new(int), new(int)}
	if _, ok := testMemo.Load(e, owners[0], 0); ok {
		t.Fatal("an empty memo answered")
	}
	for i, o := range owners[:memoOwners] {
		testMemo.Store(e, o, 1, i)
	}
	for i, o := range owners[:memoOwners] {
		if v, ok := testMemo.Load(e, o, 1); !ok || v.(int) != i {
			t.Fatalf("owner %d reads %v, %v; want %d", i, v, ok, i)
		}
		if _, ok := testMemo.Load(e, o, 2); ok {
			t.Fatalf("owner %d read its value at a later generation", i)
		}
	}
	// A fifth owner drops the oldest (owner 0); the rest keep theirs.
	testMemo.Store(e, owners[4], 7, 4)
	if _, ok := testMemo.Load(e, owners[0], 1); ok {
		t.Fatal("the oldest owner's entry survived a fifth owner")
	}
	for i := 1; i <= 4; i++ {
		gen := uint64(1)
		if i == 4 {
			gen = 7
		}
		if v, ok := testMemo.Load(e, owners[i], gen); !ok || v.(int) != i {
			t.Fatalf("owner %d reads %v, %v after the fifth stored", i, v, ok)
		}
	}
	// Storing again replaces the owner's own entry.
	testMemo.Store(e, owners[2], 9, 20)
	if v, ok := testMemo.Load(e, owners[2], 9); !ok || v.(int) != 20 {
		t.Fatalf("owner 2 reads %v, %v after its second store", v, ok)
	}
}

func TestMemoConcurrentStoresKeepEveryOwner(t *testing.T) {
	e := NewEndpoint("ns", "pod", "10.0.0.1", 8000, 0, nil, nil)
	owners := []*int{new(int), new(int), new(int), new(int)}
	var wg sync.WaitGroup
	for i, o := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				testMemo.Store(e, o, 1, i)
				if v, ok := testMemo.Load(e, o, 1); !ok || v.(int) != i {
					t.Errorf("owner %d lost its entry to a concurrent store", i)
					return
				}
			}
		}()
	}
	wg.Wait()
}
