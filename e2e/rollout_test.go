package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/sim"
	"github.com/tandem-epp/tandem/internal/testenv"
)

// rolloutRequest is one request sent during the rolling update and what served it.
type rolloutRequest struct {
	marker string
	stream bool
	r      reply
}

// 8. A rolling update of one roleset on the real kube-apiserver: its pods of revision a are
// replaced, one pod at a time, by pods of revision b (the DisaggregatedSet's revision label,
// matched by the default TANDEM_PAIR_MATCH_LABELS), with traffic running throughout. No
// request is served by a prefill pod of one revision and a decode pod of the other (the decode
// pod's sidecar runs the prefill leg on the pod Tandem named, so each simulator's record shows
// the pair); every request succeeds; and while a revision has pods of one role only, they get
// no request and the decision trace names them (pair_match_unpaired).
func TestRolloutNeverPairsRevisions(t *testing.T) {
	env := testenv.Start(t)
	ns := env.Namespace(t, "rollout")
	ctx := testCtx(t, 150*time.Second)
	var specs []podSpec
	revision := map[string]string{}
	for _, rev := range []string{"a", "b"} {
		for i := 0; i < 2; i++ {
			p := podSpec{name: fmt.Sprintf("prefill-%s%d", rev, i), role: sim.RolePrefill, roleset: "rs"}
			d := podSpec{name: fmt.Sprintf("decode-%s%d", rev, i), role: sim.RoleDecode, roleset: "rs", sidecar: true}
			specs = append(specs, p, d)
			revision[p.name], revision[d.name] = rev, rev
		}
	}
	pods := startPods(t, specs...)

	createInferencePool(ctx, t, env, ns, "rollout-pool")
	objs := map[string]*corev1.Pod{}
	live := map[string]bool{}
	add := func(name string) {
		t.Helper()
		objs[name] = createSimPod(ctx, t, env, ns, pods[name], map[string]string{pool.LabelDisaggRevision: revision[name]})
		live[name] = true
	}
	remove := func(name string) {
		t.Helper()
		if err := env.Client.Delete(ctx, objs[name], client.GracePeriodSeconds(0)); err != nil {
			t.Fatalf("deleting pod %s: %v", name, err)
		}
		delete(live, name)
	}
	for _, n := range []string{"prefill-a0", "prefill-a1", "decode-a0", "decode-a1"} {
		add(n)
	}

	a := startTandem(t, []string{"--pool-name=rollout-pool", "--pool-namespace=" + ns, "--debug-trace-header"}, defaultEnv(nil), env.Config)
	waitPool := func() {
		t.Helper()
		want := slices.Sorted(maps.Keys(live))
		eventually(t, fmt.Sprintf("Tandem's pool to hold %v", want), func() (bool, string) {
			var got []string
			for _, e := range a.Store().Load().Endpoints {
				got = append(got, e.Name)
			}
			slices.Sort(got)
			return slices.Equal(got, want), fmt.Sprintf("pool %v", got)
		})
	}
	waitPool()
	s := &stack{t: t, pods: pods, tandem: a, gwURL: startGateway(t, a.ExtProcAddr()), client: newClient()}

	var mu sync.Mutex
	var sent []rolloutRequest
	send := func(prefix string, i int) rolloutRequest {
		m := s.marker(prefix)
		stream := i%2 == 0
		rq := rolloutRequest{marker: m, stream: stream, r: s.post(ctx, "/v1/chat/completions", chatBody(prompt(m, 100), 8, stream), nil)}
		mu.Lock()
		sent = append(sent, rq)
		mu.Unlock()
		return rq
	}
	// Background traffic throughout the update, two clients in a loop; done counts each
	// client's finished requests.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var done [2]atomic.Int64
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				send(fmt.Sprintf("bg%d", w), i)
				done[w].Add(1)
			}
		}()
	}
	// settle waits until each background client has finished the request it had in flight:
	// every request after that was picked from the pool as it is now.
	settle := func(what string) {
		t.Helper()
		var at [2]int64
		for w := range done {
			at[w] = done[w].Load()
		}
		eventually(t, what+": the background requests in flight to finish", func() (bool, string) {
			for w := range done {
				if done[w].Load() <= at[w] {
					return false, fmt.Sprintf("client %d still on its request", w)
				}
			}
			return true, ""
		})
	}
	defer func() { close(stop); wg.Wait() }()

	// unpairedPhase sends requests while pods of one revision have only one role and checks
	// that the trace names them and that none of them served.
	phase := func(what string, unpaired ...string) {
		t.Helper()
		waitPool()
		settle(what)
		before := map[string]int{}
		for _, n := range unpaired {
			before[n] = countReceived(pods[n])
		}
		traced := 0
		for i := 0; i < 6; i++ {
			rq := send("step", i)
			if err := okCompletion(rq.r, rq.stream); err != nil {
				t.Fatalf("%s: request %s: %v", what, rq.marker, err)
			}
			if len(unpaired) == 0 {
				continue
			}
			var tr struct {
				Steps    []string          `json:"steps"`
				Unpaired map[string]string `json:"unpaired"`
			}
			if err := json.Unmarshal([]byte(rq.r.header.Get("X-Tandem-Trace")), &tr); err != nil {
				t.Fatalf("%s: request %s: trace %q: %v", what, rq.marker, rq.r.header.Get("X-Tandem-Trace"), err)
			}
			if slices.Contains(tr.Steps, pd.StepPairMatchUnpaired) {
				traced++
				for _, n := range unpaired {
					if !strings.Contains(fmt.Sprint(tr.Unpaired), ns+"/"+n+":") {
						t.Errorf("%s: trace names %v unpaired, not %s", what, tr.Unpaired, n)
					}
				}
			}
		}
		if len(unpaired) > 0 && traced == 0 {
			t.Errorf("%s: no decision trace has the %s step", what, pd.StepPairMatchUnpaired)
		}
		for _, n := range unpaired {
			if got := countReceived(pods[n]); got != before[n] {
				t.Errorf("%s: unpaired pod %s received %d requests", what, n, got-before[n])
			}
		}
		t.Logf("%s: pool %v", what, slices.Sorted(maps.Keys(live)))
	}

	phase("revision a")
	add("prefill-b0")
	phase("a new prefill pod of revision b, alone", "prefill-b0")
	add("decode-b0")
	phase("revision b's first pair")
	remove("prefill-a0")
	phase("one prefill pod of a gone")
	remove("decode-a0")
	phase("one pair of each revision")
	add("prefill-b1")
	phase("a second prefill pod of b")
	add("decode-b1")
	phase("two pairs of b, one of a")
	remove("prefill-a1")
	phase("revision a's last decode pod, alone", "decode-a1")
	remove("decode-a1")
	phase("revision b only")
	close(stop)
	wg.Wait()
	stop = make(chan struct{}) // for the deferred close

	// Every request, background ones included: a whole answer, from a pair of one revision.
	pairs := map[string]int{}
	for _, rq := range sent {
		if err := okCompletion(rq.r, rq.stream); err != nil {
			t.Fatalf("request %s: %v", rq.marker, err)
		}
		dec := pods[rq.r.pod]
		if dec == nil || dec.role != sim.RoleDecode {
			t.Fatalf("request %s answered by %q, want a decode pod", rq.marker, rq.r.pod)
		}
		target := waitReceived(t, dec, rq.marker).Header.Get(prefillerHeader)
		var pre *pod
		for _, p := range pods {
			if p.role == sim.RolePrefill && p.HostPort() == target {
				pre = p
			}
		}
		if pre == nil {
			t.Fatalf("request %s: decode pod %s got %s=%q, which is no prefill pod", rq.marker, dec.name, prefillerHeader, target)
		}
		if revision[pre.name] != revision[dec.name] {
			t.Fatalf("request %s: prefill pod %s (revision %s) paired with decode pod %s (revision %s)",
				rq.marker, pre.name, revision[pre.name], dec.name, revision[dec.name])
		}
		waitReceived(t, pre, rq.marker)
		pairs[pre.name+"+"+dec.name]++
	}
	t.Logf("%d requests, all served by pairs of one revision: %v", len(sent), pairs)
	if len(sent) < 9*6 {
		t.Fatalf("only %d requests sent", len(sent))
	}
}
