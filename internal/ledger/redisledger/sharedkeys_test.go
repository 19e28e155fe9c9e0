package redisledger

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tandem-epp/tandem/internal/ledger/redisledger/redistest"
)

// The bookkeeping every shared kind uses, through a real Redis: a changed key is written, a
// drained one deleted (our field only), a full publish also reaches keys that drained without
// a change and keys with a value that never changed, and a failed pipeline publishes again.
func TestSharedKeysPublish(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true})
	defer func() { _ = rdb.Close() }()
	sk := newSharedKeys(func(k string) string { return "t:" + k })
	values := map[string]string{} // "" is zero
	candidates := func() []string {
		var out []string
		for k, v := range values {
			if v != "" {
				out = append(out, k)
			}
		}
		return out
	}
	publish := func(all bool) []string {
		t.Helper()
		keys := sk.takeDirty(all, candidates)
		pipe := rdb.Pipeline()
		sk.queueWrites(ctx, pipe, "me", keys, func(key, k string) bool {
			if values[k] == "" {
				return false
			}
			pipe.HSet(ctx, key, "me", values[k])
			return true
		})
		_, err := pipe.Exec(ctx)
		sk.published(keys, err)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(keys)
		return keys
	}
	fields := func(k string) map[string]string {
		t.Helper()
		m, err := rdb.HGetAll(ctx, "t:"+k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if err := rdb.HSet(ctx, "t:b", "me", "stale", "other", "7").Err(); err != nil {
		t.Fatal(err)
	}

	values["a"] = "1"
	sk.markDirty("a", "b")
	if got := publish(false); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("published %v, want the changed a and b", got)
	}
	if a, b := fields("a"), fields("b"); a["me"] != "1" || len(b) != 1 || b["other"] != "7" {
		t.Fatalf("after publish: a %v (want me=1), b %v (want only other's field)", a, b)
	}
	if got := publish(false); len(got) != 0 {
		t.Fatalf("nothing changed, published %v", got)
	}
	// a drains without a change event and c gets a value without one: only a full publish
	// reaches them (a because Redis holds our field, c as a candidate).
	values["a"], values["c"] = "", "3"
	if got := publish(false); len(got) != 0 {
		t.Fatalf("no change marked, published %v", got)
	}
	if got := publish(true); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("full publish of %v, want a (held, drained) and c (a value)", got)
	}
	if a, c := fields("a"), fields("c"); len(a) != 0 || c["me"] != "3" {
		t.Fatalf("after the full publish: a %v (want deleted), c %v (want me=3)", a, c)
	}
	if got := publish(true); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("second full publish of %v, want c only (a no longer holds our field)", got)
	}
	// A failed pipeline: the keys go out again with the next publish.
	sk.published([]string{"c", "d"}, errors.New("redis down"))
	got := sk.takeDirty(false, nil)
	slices.Sort(got)
	if !slices.Equal(got, []string{"c", "d"}) {
		t.Fatalf("after a failure dirty %v, want c and d", got)
	}
}

// A key is read while it was asked about within watchTTL, and forgotten after.
func TestSharedKeysWatchExpires(t *testing.T) {
	sk := newSharedKeys(func(k string) string { return k })
	sk.watch(t0, "old")
	sk.watch(t0.Add(5*time.Minute), "new", "newer")
	got := sk.watchedKeys(t0.Add(watchTTL + time.Second))
	slices.Sort(got)
	if !slices.Equal(got, []string{"new", "newer"}) {
		t.Fatalf("watched %v past old's TTL, want new and newer", got)
	}
	if got := sk.watchedKeys(t0); len(got) != 2 {
		t.Fatalf("old not forgotten: %v", got)
	}
	var none *sharedKeys[string] // no latency models: nothing to share
	none.markDirty("a")
	none.watch(t0, "a")
	if none.watchedKeys(t0) != nil || none.takeDirty(true, nil) != nil {
		t.Fatal("a nil sharedKeys shares something")
	}
}

var t0 = time.Unix(1_700_000_000, 0)

// Reading: our own field is skipped, a dead replica's pruned (unless some live replicas were
// not read), a malformed one counted and pruned, the rest accepted.
func TestSharedKeysApplyReads(t *testing.T) {
	for _, tc := range []struct {
		name       string
		unread     int
		wantPruned []string
	}{
		{"every live replica read", 0, []string{"bad", "dead"}},
		{"some live replicas not read", 3, []string{"bad"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rejected := map[string]int{}
			s, err := New(Options{Addr: "127.0.0.1:1", ReplicaID: "me", Rejected: func(kind string, n int) { rejected[kind] += n }}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			sk := newSharedKeys(func(k string) string { return "t:" + k })
			rd := &read{s: s, reps: liveReplicas{live: map[string]bool{"me": true, "peer": true, "bad": true}, unread: tc.unread}}
			cmd := redis.NewMapStringStringResult(map[string]string{"me": "1", "peer": "2", "dead": "4", "bad": "x"}, nil)
			var accepted []string
			sk.applyReads(rd, []string{"k"}, []*redis.MapStringStringCmd{cmd}, RejectedSignal, func(k, val string) bool {
				if val == "x" {
					return false
				}
				accepted = append(accepted, k+"="+val)
				return true
			})
			if !slices.Equal(accepted, []string{"k=2"}) {
				t.Errorf("accepted %v, want the live peer's k=2 only", accepted)
			}
			if rejected[RejectedSignal] != 1 || len(rejected) != 1 {
				t.Errorf("rejected %v, want 1 signal", rejected)
			}
			pruned := s.prune["t:k"]
			slices.Sort(pruned)
			if !slices.Equal(pruned, tc.wantPruned) || len(s.prune) != 1 {
				t.Errorf("pruned %v, want t:k %v", s.prune, tc.wantPruned)
			}
		})
	}
}
