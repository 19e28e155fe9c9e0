package file

import (
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
)

func TestLoadSample(t *testing.T) {
	info, eps, err := Load(filepath.Join("testdata", "pd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "demo" || info.Namespace != "default" {
		t.Errorf("info = %+v", info)
	}
	var got []string
	for _, e := range eps {
		got = append(got, fmt.Sprintf("%s %s rank=%d role=%s roleset=%s engine=%s model=%s", e.Key(), e.HostPort(), e.Rank, e.Role, e.Roleset, e.Engine, e.Model))
	}
	want := []string{
		"default/prefill-0:8100 127.0.0.1:8100 rank=0 role=prefill roleset=group-0 engine=vllm model=my-model",
		"serving/decode-0:8200 127.0.0.2:8200 rank=0 role=decode roleset=group-0 engine=vllm model=my-model",
		"serving/decode-0:8202 127.0.0.2:8202 rank=2 role=decode roleset=group-0 engine=vllm model=my-model",
		// combined-0 is ready: false.
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("endpoints:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if cfg := eps[0].Annotations[pool.AnnotationConfig]; cfg != `{"profiles":{"default":{"routingStrategy":"pd"}}}` {
		t.Errorf("config annotation = %q", cfg)
	}
}

func TestParseAccepts(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       string // host:port/rank of the endpoints, space-separated
	}{
		{"empty list", "endpoints: []", ""},
		{"single port", "endpoints: [{name: a, address: 10.0.0.1, port: 8000}]", "10.0.0.1:8000/0"},
		{"quoted port", `endpoints: [{name: a, address: 10.0.0.1, port: "8000"}]`, "10.0.0.1:8000/0"},
		{"ipv6", `endpoints: [{name: a, address: "fd00::1", port: 8000}]`, "[fd00::1]:8000/0"},
		{"port label overrides the single port", "endpoints: [{name: a, address: 10.0.0.1, port: 8000, labels: {model.aibrix.ai/port: 8100}}]", "10.0.0.1:8100/0"},
		{"port label ignored with ranks", "endpoints: [{name: a, address: 10.0.0.1, ports: [8000, 8001], labels: {model.aibrix.ai/port: 8100}}]", "10.0.0.1:8000/0 10.0.0.1:8001/1"},
		{"llm-d active ports", `endpoints: [{name: a, address: 10.0.0.1, ports: [1, 2, 3], annotations: {llm-d.ai/active-ports: "3"}}]`, "10.0.0.1:3/2"},
		{"not ready is left out", "endpoints: [{name: a, address: 10.0.0.1, port: 8000, ready: false}, {name: b, address: 10.0.0.2, port: 8000, ready: true}]", "10.0.0.2:8000/0"},
		{"same name, other namespace", "endpoints: [{name: a, address: 10.0.0.1, port: 1}, {name: a, namespace: x, address: 10.0.0.2, port: 1}]", "10.0.0.1:1/0 10.0.0.2:1/0"},
		{"same address, other port", "endpoints: [{name: a, address: 10.0.0.1, port: 1}, {name: b, address: 10.0.0.1, port: 2}]", "10.0.0.1:1/0 10.0.0.1:2/0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, eps, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			var got []string
			for _, e := range eps {
				got = append(got, fmt.Sprintf("%s/%d", e.HostPort(), e.Rank))
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("got %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}

const okEntry = "name: a, address: 10.0.0.1, port: 8000"

// parseErrorCases lists every message the parser gives, exactly as a user reads it
// (TestParseErrors checks them; docs_test.go checks docs/pool-file.md lists them).
var parseErrorCases = func() []parseErrorCase {
	const ok = okEntry
	return []parseErrorCase{
		{"empty file", "  \n", "the file is empty; it needs `endpoints:` with a list of endpoints"},
		{"bad yaml", "endpoints: [", "not valid YAML: line 1: did not find expected node content"},
		{"two documents", "endpoints: []\n---\nendpoints: []\n", "a second YAML document (after ---); put everything in one"},
		{"top level list", "- a", "(top level): must be a mapping with fields pool, endpoints, objectives (line 1)"},
		{"missing endpoints", "pool: {name: p}", "endpoints: required: a list of endpoints (it may be empty: endpoints: [])"},
		{"endpoints not a list", "endpoints: {a: 1}", "endpoints: must be a list (line 1)"},
		{"unknown top-level field", "endpoint: []\nendpoints: []", "endpoint: unknown field (line 1); known fields: pool, endpoints, objectives"},
		{"pool not a mapping", "pool: demo\nendpoints: []", "pool: must be a mapping with fields name, namespace (line 1)"},
		{"pool name not a string", "pool: {name: [a]}\nendpoints: []", "pool.name: must be a string (line 1)"},
		{"objectives not a list", "objectives: {batch: -1}\nendpoints: []", "objectives: must be a list of {name, priority} (line 1)"},
		{"objective without a name", "objectives: [{priority: -1}]\nendpoints: []",
			"objectives[0].name: required: the name requests give in x-gateway-inference-objective"},
		{"objective with a bad name", "objectives: [{name: Batch}]\nendpoints: []",
			`objectives[0].name: "Batch": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`},
		{"objective given twice", "objectives: [{name: batch}, {name: batch, priority: 1}]\nendpoints: []",
			`objectives[1].name: duplicate objective "batch" (also objectives[0])`},
		{"objective priority not a number", "objectives: [{name: batch, priority: low}]\nendpoints: []",
			`objectives[0].priority: must be a whole number (a 32-bit integer; negative is sheddable), got "low" (line 1)`},
		{"objective priority out of range", "objectives: [{name: batch, priority: 3000000000}]\nendpoints: []",
			`objectives[0].priority: must be a whole number (a 32-bit integer; negative is sheddable), got "3000000000" (line 1)`},
		{"label given twice", "endpoints: [{" + ok + ", labels: {a: b, a: c}}]", `endpoints[0].labels["a"]: given twice (line 1)`},
		{"unknown pool field", "pool: {nam: p}\nendpoints: []", "pool.nam: unknown field (line 1); known fields: name, namespace"},
		{"unknown endpoint field", "endpoints:\n- {" + ok + ", adress: x}", "endpoints[0].adress: unknown field (line 2); known fields: name, namespace, address, port, ports, labels, annotations, ready"},
		{"field twice", "endpoints:\n- {" + ok + ", port: 9}", "endpoints[0].port: given twice (line 2)"},
		{"entry not a mapping", "endpoints: [x]", "endpoints[0]: must be a mapping with fields name, namespace, address, port, ports, labels, annotations, ready (line 1)"},
		{"missing name", "endpoints: [{address: 10.0.0.1, port: 1}]", "endpoints[0].name: required"},
		{"name not a string", "endpoints: [{name: [a], address: 10.0.0.1, port: 1}]", "endpoints[0].name: must be a string (line 1)\nendpoints[0].name: required"},
		{"bad name", "endpoints: [{name: Prefill_0, address: 10.0.0.1, port: 1}]",
			`endpoints[0].name: "Prefill_0": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`},
		{"bad namespace", "endpoints: [{name: a, namespace: a.b, address: 10.0.0.1, port: 1}]",
			`endpoints[0].namespace: "a.b": must not contain dots`},
		{"missing address", "endpoints: [{name: a, port: 1}]", "endpoints[0].address: required: the IP address the endpoint serves on"},
		{"address not an IP", "endpoints: [{" + ok + "}, {" + ok + "}, {name: c, address: abc, port: 1}]",
			"endpoints[1]: duplicate endpoint default/a (also endpoints[0]); name and namespace must be unique\n" +
				`endpoints[2].address: "abc" is not an IP address`},
		{"address with port", "endpoints: [{name: a, address: '10.0.0.1:80', port: 1}]", `endpoints[0].address: "10.0.0.1:80" is not an IP address`},
		{"address with zone", "endpoints: [{name: a, address: 'fe80::1%eth0', port: 1}]", `endpoints[0].address: "fe80::1%eth0" is not an IP address`},
		{"no port", "endpoints: [{name: a, address: 10.0.0.1}]", "endpoints[0]: port or ports is required"},
		{"port and ports", "endpoints: [{name: a, address: 10.0.0.1, port: 1, ports: [2]}]", "endpoints[0]: set either port or ports, not both"},
		{"port out of range", "endpoints: [{name: a, address: 10.0.0.1, port: 70000}]", "endpoints[0].port: 70000 is out of range 1-65535"},
		{"port zero", "endpoints: [{name: a, address: 10.0.0.1, ports: [1, 0]}]", "endpoints[0].ports[1]: 0 is out of range 1-65535"},
		{"port not a number", "endpoints: [{name: a, address: 10.0.0.1, port: http}]", `endpoints[0].port: "http" is not a port number`},
		{"port a list", "endpoints: [{name: a, address: 10.0.0.1, port: [1]}]", "endpoints[0].port: must be a port number (line 1)"},
		{"ports not a list", "endpoints: [{name: a, address: 10.0.0.1, ports: 1}]", "endpoints[0].ports: must be a list of port numbers (line 1)"},
		{"ports empty", "endpoints: [{name: a, address: 10.0.0.1, ports: []}]", "endpoints[0].ports: has 0 ports; give 1 to 8, as an InferencePool's targetPorts"},
		{"nine ports", "endpoints: [{name: a, address: 10.0.0.1, ports: [1,2,3,4,5,6,7,8,9]}]", "endpoints[0].ports: has 9 ports; give 1 to 8, as an InferencePool's targetPorts"},
		{"duplicate port", "endpoints: [{name: a, address: 10.0.0.1, ports: [8000, 8001, 8000]}]", "endpoints[0].ports[2]: duplicate port 8000 (also ports[0])"},
		{"duplicate address:port", "endpoints: [{name: a, address: 10.0.0.1, port: 1}, {name: b, address: 10.0.0.1, port: 1}]",
			"endpoints[1]: 10.0.0.1:1 is also served by endpoints[0]; each address:port may appear once"},
		{"labels not a mapping", "endpoints: [{" + ok + ", labels: [a]}]", "endpoints[0].labels: must be a mapping of strings (line 1)"},
		{"label value a mapping", "endpoints: [{" + ok + ", labels: {a: {b: c}}}]", `endpoints[0].labels["a"]: must be a string (line 1); quote JSON values`},
		{"bad label key", "endpoints: [{" + ok + ", labels: {'a b': c}}]",
			`endpoints[0].labels["a b"]: bad key: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`},
		{"bad label value", "endpoints: [{" + ok + ", labels: {a: 'b c'}}]",
			`endpoints[0].labels["a"]: "b c": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')`},
		{"annotation value JSON unquoted", "endpoints: [{" + ok + ", annotations: {model.aibrix.ai/config: {profiles: {}}}}]",
			`endpoints[0].annotations["model.aibrix.ai/config"]: must be a string (line 1); quote JSON values`},
		{"model config not JSON", "endpoints: [{" + ok + `, annotations: {model.aibrix.ai/config: '{"profiles":'}}]`,
			`endpoints[0].annotations["model.aibrix.ai/config"]: must be a JSON object: unexpected end of JSON input; ` +
				`give a JSON object such as '{"profiles":{"default":{"routingStrategy":"pd"}}}' (docs/configuration.md, model config annotation)`},
		{"bad port label", "endpoints: [{" + ok + ", labels: {model.aibrix.ai/port: http}}]",
			`endpoints[0].labels["model.aibrix.ai/port"]: "http" is not a port number`},
		{"bad active-ports entry", "endpoints: [{" + ok + ", annotations: {inference.networking.k8s.io/active-ports: '8000,x'}}]",
			`endpoints[0].annotations["inference.networking.k8s.io/active-ports"]: "x" is not a port number`},
		{"ready not a bool", "endpoints: [{" + ok + ", ready: yes}]", `endpoints[0].ready: must be true or false, got "yes" (line 1)`},
		{"every problem at once", "endpoints:\n- {name: a, address: x, port: 0}\n- {name: b}",
			"endpoints[0].address: \"x\" is not an IP address\nendpoints[0].port: 0 is out of range 1-65535\n" +
				"endpoints[1].address: required: the IP address the endpoint serves on\nendpoints[1]: port or ports is required"},
	}
}()

type parseErrorCase struct {
	name, yaml string
	want       string // the whole error, lines joined by \n
}

func TestParseErrors(t *testing.T) {
	for _, tc := range parseErrorCases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("accepted; want error %q", tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n%s\nwant:\n%s", err, tc.want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, _, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("err = %v", err)
	}
}

// The objectives list: names with priorities (0 when left out), in the document.
func TestParseObjectives(t *testing.T) {
	d, err := ParseDocument([]byte("objectives:\n- {name: batch, priority: -1}\n- {name: chat, priority: 5}\n- name: plain\nendpoints: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"batch": -1, "chat": 5, "plain": 0}; !maps.Equal(d.Objectives, want) {
		t.Errorf("objectives %v, want %v", d.Objectives, want)
	}
	d, err = ParseDocument([]byte("endpoints: []\n"))
	if err != nil || d.Objectives == nil || len(d.Objectives) != 0 {
		t.Errorf("no objectives: %v %v, want an empty set", d.Objectives, err)
	}
}
