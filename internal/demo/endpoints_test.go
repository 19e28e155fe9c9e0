package demo

import (
	"os"
	"path/filepath"
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
