package demo

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
	poolfile "github.com/tandem-epp/tandem/internal/pool/file"
	"github.com/tandem-epp/tandem/internal/sim"
)

// What EndpointsFile writes is what the file pool source reads: the pool, every pod's
// address, port, role and annotations; a rewrite replaces the file whole.
func TestEndpointsFileRoundTrip(t *testing.T) {
	pf := sim.StartForTest(t, sim.PodConfig{Name: "p", Engine: sim.EngineVLLM, Role: sim.RolePrefill, Model: Model})
	dc := sim.StartForTest(t, sim.PodConfig{Name: "d", Engine: sim.EngineVLLM, Role: sim.RoleDecode, Model: Model})
	labels := func(role string) map[string]string {
		return map[string]string{pool.LabelModelName: Model, pool.LabelEngine: "vllm", pool.LabelRoleName: role, pool.LabelRolesetName: "rs-0"}
	}
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	f := EndpointsFile{Pool: map[string]string{"name": "rt", "namespace": "ns"}, Endpoints: []FileEndpoint{
		SimEndpoint("prefill-0", pf, labels("prefill"), map[string]string{pool.AnnotationConfig: "{}"}),
		SimEndpoint("decode-0", dc, labels("decode"), nil),
	}}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	info, eps, err := poolfile.Load(path)
	if err != nil {
		t.Fatalf("the file pool source refuses what EndpointsFile wrote: %v", err)
	}
	if info.Name != "rt" || info.Namespace != "ns" || len(eps) != 2 {
		t.Fatalf("pool %s/%s with %d endpoints, want ns/rt with 2", info.Namespace, info.Name, len(eps))
	}
	byName := map[string]*pool.Endpoint{}
	for _, e := range eps {
		byName[e.Name] = e
	}
	for _, c := range []struct {
		name, hostPort string
		role           pool.Role
		config         string
	}{
		{"prefill-0", pf.HostPort(), pool.RolePrefill, "{}"},
		{"decode-0", dc.HostPort(), pool.RoleDecode, ""},
	} {
		e := byName[c.name]
		if e == nil || e.HostPort() != c.hostPort || e.Role != c.role || e.Annotations[pool.AnnotationConfig] != c.config {
			t.Errorf("%s: got %+v, want %s role %v config %q", c.name, e, c.hostPort, c.role, c.config)
		}
	}

	// An empty rewrite is a valid, empty pool, and no temporary file is left behind.
	if err := (EndpointsFile{Pool: f.Pool}).Write(path); err != nil {
		t.Fatal(err)
	}
	if _, eps, err := poolfile.Load(path); err != nil || len(eps) != 0 {
		t.Fatalf("after an empty rewrite: %d endpoints, error %v; want 0 and nil", len(eps), err)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
}

// The summary says who ran the prefill legs, from the traces of the PD requests.
func TestHandoffLine(t *testing.T) {
	roles := map[string]string{"d": "decode", "s": "standard"}
	pd := func(steps ...string) Result { return Result{Pod: "d", PD: true, Steps: steps} }
	for _, c := range []struct {
		results []Result
		want    string
	}{
		{[]Result{{Pod: "s"}}, "hand-off: no PD request"},
		{[]Result{pd("pd_pair"), pd("pd_pair"), {Pod: "s"}}, "hand-off: sidecar — each decode pod's routing sidecar ran the prefill leg of all 2 PD requests"},
		{[]Result{pd("pd_pair", "handoff_epp:vllm")}, "hand-off: epp — Tandem ran the prefill leg of all 1 PD requests itself"},
		{[]Result{pd("handoff_epp:vllm"), pd()}, "hand-off: Tandem (epp) ran 1 prefill legs, the decode pods' sidecars 1"},
	} {
		if got := handoffLine(c.results, roles); !strings.HasPrefix(got, c.want) {
			t.Errorf("handoffLine = %q, want %q…", got, c.want)
		}
	}
}

// The curl CurlHint prints, run by bash, sends a prompt long enough for a prefill/decode pair.
func TestCurlHintPromptGoesPD(t *testing.T) {
	var b strings.Builder
	CurlHint(&b, "http://127.0.0.1:8080")
	text := b.String()
	start := strings.Index(text, "-d '")
	end := strings.Index(text[start:], "\n")
	script := "printf '%s' " + text[start+3:start+end]
	out, err := exec.Command("bash", "-c", script).Output()
	if err != nil {
		t.Fatalf("bash -c %s: %v", script, err)
	}
	var body struct{ Model, Prompt string }
	if err := json.Unmarshal(out, &body); err != nil {
		t.Fatalf("the hint's body is not JSON: %v\n%s", err, out)
	}
	if body.Model != Model || len(body.Prompt) < BucketTokens*4 {
		t.Errorf("model %q, prompt of %d bytes: want %q and at least %d bytes", body.Model, len(body.Prompt), Model, BucketTokens*4)
	}
}
