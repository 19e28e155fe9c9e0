package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/sim"
)

// The built cmd/epp binary as a real child process, in the demo's stack (internal/demo builds
// and assembles it; reused here, not duplicated): long prompts go PD with the prefill leg
// really run on the paired prefill pod, short ones to the standard pod (the demo's bucketing).
func TestBuiltBinaryRoutesPDAndStandard(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	root, err := demo.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin, err := demo.BuildEPP(ctx, root, dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := demo.StartStack(ctx, demo.StackOptions{
		RunEPP:    demo.ProcessEPP(bin, filepath.Join(dir, "epp.log"), map[string]string{"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "100"}),
		TimeScale: simTimeScale, Listen: "127.0.0.1:0", Logger: logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Stop)
	byName := map[string]*demo.Pod{}
	for _, p := range st.Pods {
		byName[p.Name] = p
	}
	c := newClient()
	// The demo's pods keep only their last recorded request, so each check follows its request.
	waitLast := func(p *demo.Pod, marker string) sim.Recorded {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := p.Server.WaitRequest(wctx, func(r sim.Recorded) bool { return hasMarker(r.Body, marker) })
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		return r
	}
	seen := map[string]int{}
	for i := 0; i < 8; i++ {
		// Long: ≥ demo.BucketTokens, the PD pairs' bucket.
		m := "bin-long-" + string(rune('a'+i))
		r := post(ctx, c, st.GatewayURL, "/v1/chat/completions", chatBodyFor(demo.Model, prompt(m, demo.BucketTokens+500), 4, i%2 == 0), nil)
		if err := okCompletion(r, i%2 == 0); err != nil {
			t.Fatalf("long prompt: %v", err)
		}
		dec := byName[r.pod]
		if dec == nil || dec.Role != sim.RoleDecode {
			t.Fatalf("long prompt answered by %q, want a decode pod", r.pod)
		}
		in := waitLast(dec, m)
		target := in.Header.Get(prefillerHeader)
		pre := byName["prefill-"+dec.Roleset[len("rs-"):]]
		if pre == nil || target != pre.Server.HostPort() {
			t.Fatalf("decode pod %s (roleset %s) got %s=%q, want its roleset's prefill pod", dec.Name, dec.Roleset, prefillerHeader, target)
		}
		leg := waitLast(pre, m)
		var body prefillLeg
		if err := json.Unmarshal(leg.Body, &body); err != nil || body.KVTransferParams["do_remote_decode"] != true || body.MaxTokens != 1 {
			t.Fatalf("prefill leg on %s: %v %s", pre.Name, err, leg.Body)
		}
		seen[dec.Roleset]++

		// Short: below the bucket, the standard pod runs it whole.
		m = "bin-short-" + string(rune('a'+i))
		r = post(ctx, c, st.GatewayURL, "/v1/completions", completionBodyFor(demo.Model, prompt(m, 100), 4, false), nil)
		if err := okCompletion(r, false); err != nil {
			t.Fatalf("short prompt: %v", err)
		}
		if r.pod != "standard-0" {
			t.Fatalf("short prompt answered by %q, want standard-0", r.pod)
		}
		if h := waitLast(byName["standard-0"], m).Header.Get(prefillerHeader); h != "" {
			t.Fatalf("standard pod got %s=%q", prefillerHeader, h)
		}
	}
	t.Logf("PD requests per roleset through the binary: %v", seen)
}

// TestNoKubeBuild: `-tags nokube` (the demo's build) links no Kubernetes client, and the binary
// answers a pool it cannot follow with an error that says what to do, before serving anything.
func TestNoKubeBuild(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	root, err := demo.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	list := exec.CommandContext(ctx, "go", "list", "-deps", "-tags", "nokube", "./cmd/epp")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "sigs.k8s.io/controller-runtime") || strings.HasPrefix(p, "k8s.io/client-go") || strings.HasPrefix(p, "k8s.io/api/") {
			t.Errorf("cmd/epp built with -tags nokube depends on %s", p)
		}
	}
	bin, err := demo.BuildEPP(ctx, root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--pool-name=my-pool", "--secure-serving=false", "--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0")
	msg, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "built without Kubernetes support (-tags nokube): give the pool with --endpoints-file") {
		t.Errorf("a nokube epp given --pool-name: err %v, output:\n%s", err, msg)
	}
}
