// Package file feeds the pool Store from a YAML file of endpoints shaped like pods (name,
// namespace, address, ports, labels, annotations, ready), so Tandem runs the same without a
// cluster. Parsing is strict and every problem is reported with its path; Watch reloads on
// change and keeps the last good snapshot when the file turns bad. It must not score or pick.
//
// The format:
//
//	pool: {name: demo, namespace: default}   # optional
//	endpoints:
//	- name: prefill-0
//	  namespace: default        # default "default"
//	  address: 127.0.0.1
//	  ports: [8100]             # or port: 8100; several ports = data-parallel ranks
//	  labels: {role-name: prefill, roleset-name: group-0}
//	  annotations: {model.aibrix.ai/config: '{"profiles":{}}'}
//	  ready: true               # default true; false keeps the entry out of the pool
//	objectives:                 # optional: InferenceObjectives by name
//	- {name: batch, priority: -1}
//
// An entry's ports play the InferencePool's target ports for that pod, and the same rules as in
// Kubernetes apply (internal/pool/podports): rank = index in ports, the active-ports annotation
// restricts them, model.aibrix.ai/port overrides a single port. A label or annotation the
// Kubernetes source would only warn about is an error here.
package file

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/pool/podports"
)

// maxPorts mirrors the InferencePool's limit of 8 target ports.
const maxPorts = 8

// The fields the file may hold, by level; any other is an error. docs/pool-file.md documents
// each one (docs_test.go checks both ways).
var (
	TopFields       = []string{"pool", "endpoints", "objectives"}
	PoolFields      = []string{"name", "namespace"}
	EndpointFields  = []string{"name", "namespace", "address", "port", "ports", "labels", "annotations", "ready"}
	ObjectiveFields = []string{"name", "priority"}
)

// Document is a parsed endpoints file.
type Document struct {
	Info pool.Info
	// Endpoints are those of the ready entries.
	Endpoints []*pool.Endpoint
	// Objectives are the InferenceObjectives' priorities by name (`objectives:`), the file
	// form of the InferenceObjective objects a cluster holds; never nil.
	Objectives map[string]int
}

// Load reads and validates an endpoints file. It returns the endpoints of the ready entries.
func Load(path string) (pool.Info, []*pool.Endpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return pool.Info{}, nil, fmt.Errorf("endpoints file: %w", err)
	}
	info, eps, err := Parse(data)
	if err != nil {
		return pool.Info{}, nil, fmt.Errorf("endpoints file %s: %w", path, err)
	}
	return info, eps, nil
}

// Parse validates the file's content. The error lists every problem, one per line, each
// starting with its path: `endpoints[2].address: "abc" is not an IP address`.
func Parse(data []byte) (pool.Info, []*pool.Endpoint, error) {
	d, err := ParseDocument(data)
	return d.Info, d.Endpoints, err
}

// ParseDocument is Parse with the file's objectives.
func ParseDocument(data []byte) (Document, error) { return ParseDocumentMatching(data, nil) }

// ParseDocumentMatching is ParseDocument with each endpoint's Revision read by match (the
// pair-match labels).
func ParseDocumentMatching(data []byte, match pool.PairMatch) (Document, error) {
	p := &parser{objectives: map[string]int{}, match: match}
	info, entries := p.document(data)
	if len(p.errs) > 0 {
		return Document{}, errors.New(strings.Join(p.errs, "\n"))
	}
	var eps []*pool.Endpoint
	for _, e := range entries {
		if e.ready {
			eps = append(eps, e.endpoints...)
		}
	}
	return Document{Info: info, Endpoints: eps, Objectives: p.objectives}, nil
}

type entry struct {
	ready     bool
	endpoints []*pool.Endpoint
}

type parser struct {
	errs       []string
	objectives map[string]int
	match      pool.PairMatch
}

func (p *parser) errorf(path, format string, args ...any) {
	p.errs = append(p.errs, path+": "+fmt.Sprintf(format, args...))
}

func (p *parser) document(data []byte) (pool.Info, []entry) {
	if len(bytes.TrimSpace(data)) == 0 {
		p.errs = append(p.errs, "the file is empty; it needs `endpoints:` with a list of endpoints")
		return pool.Info{}, nil
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		p.errs = append(p.errs, "not valid YAML: "+strings.TrimPrefix(err.Error(), "yaml: "))
		return pool.Info{}, nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		p.errs = append(p.errs, "a second YAML document (after ---); put everything in one")
		return pool.Info{}, nil
	}
	root := doc.Content[0]
	fields := p.mapping("(top level)", root, TopFields...)
	if fields == nil {
		return pool.Info{}, nil
	}
	var info pool.Info
	if n, ok := fields["pool"]; ok {
		pf := p.mapping("pool", n, PoolFields...)
		info.Name = p.str("pool.name", pf["name"])
		info.Namespace = p.str("pool.namespace", pf["namespace"])
	}
	if n, ok := fields["objectives"]; ok {
		p.objectiveList(n)
	}
	list, ok := fields["endpoints"]
	if !ok {
		p.errorf("endpoints", "required: a list of endpoints (it may be empty: endpoints: [])")
		return info, nil
	}
	if list.Kind != yaml.SequenceNode {
		p.errorf("endpoints", "must be a list (line %d)", list.Line)
		return info, nil
	}
	var entries []entry
	names := map[string]int{}     // ns/name -> index
	hostPorts := map[string]int{} // ip:port -> index
	for i, n := range list.Content {
		path := fmt.Sprintf("endpoints[%d]", i)
		e, ok := p.endpoint(path, n)
		if !ok {
			continue
		}
		if j, dup := names[e.podKey]; dup {
			p.errorf(path, "duplicate endpoint %s (also endpoints[%d]); name and namespace must be unique", e.podKey, j)
			continue
		}
		names[e.podKey] = i
		for _, ep := range e.endpoints {
			if j, dup := hostPorts[ep.HostPort()]; dup {
				p.errorf(path, "%s is also served by endpoints[%d]; each address:port may appear once", ep.HostPort(), j)
				continue
			}
			hostPorts[ep.HostPort()] = i
		}
		entries = append(entries, e.entry)
	}
	return info, entries
}

type parsedEntry struct {
	entry
	podKey string
}

func (p *parser) endpoint(path string, n *yaml.Node) (parsedEntry, bool) {
	before := len(p.errs)
	f := p.mapping(path, n, EndpointFields...)
	if f == nil {
		return parsedEntry{}, false
	}
	name := p.str(path+".name", f["name"])
	switch {
	case f["name"] == nil || name == "":
		p.errorf(path+".name", "required")
	default:
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			p.errorf(path+".name", "%q: %s", name, msg)
		}
	}
	ns := "default"
	if f["namespace"] != nil {
		ns = p.str(path+".namespace", f["namespace"])
		for _, msg := range validation.IsDNS1123Label(ns) {
			p.errorf(path+".namespace", "%q: %s", ns, msg)
		}
	}
	address := p.str(path+".address", f["address"])
	if f["address"] == nil || address == "" {
		p.errorf(path+".address", "required: the IP address the endpoint serves on")
	} else if a, err := netip.ParseAddr(address); err != nil || a.Zone() != "" {
		p.errorf(path+".address", "%q is not an IP address", address)
	}
	ports := p.ports(path, f["port"], f["ports"])
	labels := p.stringMap(path+".labels", f["labels"], true)
	annotations := p.stringMap(path+".annotations", f["annotations"], false)
	ready := true
	if n := f["ready"]; n != nil {
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&ready) != nil {
			p.errorf(path+".ready", "must be true or false, got %q (line %d)", n.Value, n.Line)
		}
	}
	if len(p.errs) > before {
		return parsedEntry{}, false
	}
	p.modelConfig(path, annotations)
	eps, warnings := podports.Endpoints(ns, name, address, ports, labels, annotations, p.match)
	for _, w := range warnings {
		p.errorf(path+"."+w.Field, "%s", w.Problem)
	}
	if len(p.errs) > before {
		return parsedEntry{}, false
	}
	return parsedEntry{entry: entry{ready: ready, endpoints: eps}, podKey: ns + "/" + name}, true
}

func (p *parser) ports(path string, one, many *yaml.Node) []int32 {
	switch {
	case one != nil && many != nil:
		p.errorf(path, "set either port or ports, not both")
		return nil
	case one != nil:
		if port, ok := p.port(path+".port", one); ok {
			return []int32{port}
		}
		return nil
	case many == nil:
		p.errorf(path, "port or ports is required")
		return nil
	}
	if many.Kind != yaml.SequenceNode {
		p.errorf(path+".ports", "must be a list of port numbers (line %d)", many.Line)
		return nil
	}
	if len(many.Content) == 0 || len(many.Content) > maxPorts {
		p.errorf(path+".ports", "has %d ports; give 1 to %d, as an InferencePool's targetPorts", len(many.Content), maxPorts)
		return nil
	}
	var out []int32
	seen := map[int32]int{}
	for i, n := range many.Content {
		ipath := fmt.Sprintf("%s.ports[%d]", path, i)
		port, ok := p.port(ipath, n)
		if !ok {
			continue
		}
		if j, dup := seen[port]; dup {
			p.errorf(ipath, "duplicate port %d (also ports[%d])", port, j)
			continue
		}
		seen[port] = i
		out = append(out, port)
	}
	return out
}

func (p *parser) port(path string, n *yaml.Node) (int32, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!str") {
		p.errorf(path, "must be a port number (line %d)", n.Line)
		return 0, false
	}
	port, err := podports.ParsePort(n.Value)
	if err != nil {
		p.errorf(path, "%v", err)
		return 0, false
	}
	return port, true
}

// mapping checks that n is a mapping whose keys are all known and unique; it returns key -> value.
func (p *parser) mapping(path string, n *yaml.Node, known ...string) map[string]*yaml.Node {
	if n.Kind != yaml.MappingNode {
		p.errorf(path, "must be a mapping with fields %s (line %d)", strings.Join(known, ", "), n.Line)
		return nil
	}
	out := map[string]*yaml.Node{}
	prefix := path + "."
	if path == "(top level)" {
		prefix = ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case !slices.Contains(known, k.Value):
			p.errorf(prefix+k.Value, "unknown field (line %d); known fields: %s", k.Line, strings.Join(known, ", "))
		case out[k.Value] != nil:
			p.errorf(prefix+k.Value, "given twice (line %d)", k.Line)
		default:
			out[k.Value] = v
		}
	}
	return out
}

// str reads a scalar as a string; nil reads as "".
func (p *parser) str(path string, n *yaml.Node) string {
	if n == nil {
		return ""
	}
	if n.Kind != yaml.ScalarNode {
		p.errorf(path, "must be a string (line %d)", n.Line)
		return ""
	}
	return n.Value
}

// modelConfig checks that the model.aibrix.ai/config annotation is the JSON object the router
// reads. In a cluster an unusable one is a warning and the gateway defaults apply; here it is an
// error. Its fields are checked when the pod joins, against the names the router knows (a
// --config-file may define more strategies), and a bad one is a warning there as in a cluster.
func (p *parser) modelConfig(path string, annotations map[string]string) {
	raw, ok := annotations[pool.AnnotationConfig]
	if !ok {
		return
	}
	if _, _, err := config.ParseModelConfig(raw, config.Names{}); err != nil {
		p.errorf(fmt.Sprintf("%s.annotations[%q]", path, pool.AnnotationConfig),
			"%v; give a JSON object such as '{\"profiles\":{\"default\":{\"routingStrategy\":\"pd\"}}}' (docs/configuration.md, model config annotation)", err)
	}
}

// stringMap reads labels or annotations, with Kubernetes' rules for their keys (and label values).
func (p *parser) stringMap(path string, n *yaml.Node, isLabels bool) map[string]string {
	out := map[string]string{}
	if n == nil {
		return out
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(path, "must be a mapping of strings (line %d)", n.Line)
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		kpath := fmt.Sprintf("%s[%q]", path, k.Value)
		if v.Kind != yaml.ScalarNode {
			p.errorf(kpath, "must be a string (line %d); quote JSON values", v.Line)
			continue
		}
		if _, dup := out[k.Value]; dup {
			p.errorf(kpath, "given twice (line %d)", k.Line)
			continue
		}
		for _, msg := range validation.IsQualifiedName(k.Value) {
			p.errorf(kpath, "bad key: %s", msg)
		}
		if isLabels {
			for _, msg := range validation.IsValidLabelValue(v.Value) {
				p.errorf(kpath, "%q: %s", v.Value, msg)
			}
		}
		out[k.Value] = v.Value
	}
	return out
}

// objectiveList reads `objectives:`, a list of {name, priority}: InferenceObjectives as the
// file gives them (a name as in Kubernetes, a 32-bit priority, 0 when left out).
func (p *parser) objectiveList(n *yaml.Node) {
	if n.Kind != yaml.SequenceNode {
		p.errorf("objectives", "must be a list of {name, priority} (line %d)", n.Line)
		return
	}
	seen := map[string]int{}
	for i, item := range n.Content {
		path := fmt.Sprintf("objectives[%d]", i)
		f := p.mapping(path, item, ObjectiveFields...)
		if f == nil {
			continue
		}
		name := p.str(path+".name", f["name"])
		if name == "" {
			p.errorf(path+".name", "required: the name requests give in x-gateway-inference-objective")
			continue
		}
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			p.errorf(path+".name", "%q: %s", name, msg)
		}
		if j, dup := seen[name]; dup {
			p.errorf(path+".name", "duplicate objective %q (also objectives[%d])", name, j)
			continue
		}
		seen[name] = i
		prio := 0
		if v := f["priority"]; v != nil {
			var x int64
			if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || v.Decode(&x) != nil || x < math.MinInt32 || x > math.MaxInt32 {
				p.errorf(path+".priority", "must be a whole number (a 32-bit integer; negative is sheddable), got %q (line %d)", v.Value, v.Line)
				continue
			}
			prio = int(x)
		}
		p.objectives[name] = prio
	}
}
