package demo

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/tandem-epp/tandem/internal/sim"
)

// EndpointsFile is the YAML the file pool source reads (internal/pool/file, --endpoints-file):
// the pool's name and namespace and one entry per pod. The demo, the benchmarks and the
// end-to-end tests write their pools with it.
type EndpointsFile struct {
	Pool      map[string]string `json:"pool,omitempty"` // name, namespace
	Endpoints []FileEndpoint    `json:"endpoints"`
}

// FileEndpoint is one pod of an EndpointsFile.
type FileEndpoint struct {
	Name        string            `json:"name"`
	Address     string            `json:"address"`
	Port        int               `json:"port"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// SimEndpoint is the entry of a simulated pod: its name, the address and port it serves on,
// its labels and annotations.
func SimEndpoint(name string, s *sim.Server, labels, annotations map[string]string) FileEndpoint {
	host, port, _ := net.SplitHostPort(s.HostPort()) // a listener's address always splits
	n, _ := strconv.Atoi(port)
	return FileEndpoint{Name: name, Address: host, Port: n, Labels: labels, Annotations: annotations}
}

// Write replaces the file at path atomically (a temporary file renamed over it, as a
// ConfigMap update or a careful editor would), so a watching Tandem never reads half of it.
func (f EndpointsFile) Write(path string) error {
	if f.Endpoints == nil {
		f.Endpoints = []FileEndpoint{} // "endpoints: []", not null
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("endpoints file: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
