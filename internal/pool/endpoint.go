package pool

import (
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
)

// Role is the phase a pod serves in disaggregated serving.
type Role string

const (
	// RolePrefill pods compute the prompt's KV cache and hand it to a decode pod.
	RolePrefill Role = "prefill"
	// RoleDecode pods receive the KV cache and generate the output tokens.
	RoleDecode Role = "decode"
	// RoleStandard pods run both phases ("combined" pods, or pools without PD).
	RoleStandard Role = "standard"
)

// Labels and annotations Tandem reads from pods, named exactly as the seed and llm-d name them.
const (
	LabelRoleName                 = "role-name"
	LabelRolesetName              = "roleset-name"
	LabelLLMDRole                 = "llm-d.ai/role"
	LabelModelName                = "model.aibrix.ai/name"
	LabelModelPort                = "model.aibrix.ai/port"
	LabelEngine                   = "model.aibrix.ai/engine"
	LabelKVConnector              = "model.aibrix.ai/kv-connector-type"
	AnnotationConfig              = "model.aibrix.ai/config"
	AnnotationSGLangBootstrapPort = "model.aibrix.ai/sglang-bootstrap-port"
	// AnnotationActivePorts restricts which of the pool's target ports are live on a pod (GIE's name,
	// with llm-d's newer name accepted too).
	AnnotationActivePorts     = "inference.networking.k8s.io/active-ports"
	AnnotationLLMDActivePorts = "llm-d.ai/active-ports"
)

// Engine names accepted in the model.aibrix.ai/engine label.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	EngineTRTLLM = "trtllm"
)

// Engines are the model.aibrix.ai/engine values Tandem knows.
var Engines = []string{EngineVLLM, EngineSGLang, EngineTRTLLM}

// DefaultSGLangBootstrapPort is an SGLang prefill pod's KV bootstrap port when it has no
// model.aibrix.ai/sglang-bootstrap-port annotation.
const DefaultSGLangBootstrapPort = 8998

// SGLangBootstrapPort is the pod's KV bootstrap port: its annotation, else the default; err
// names the annotation when it holds no port number (1-65535).
func (e *Endpoint) SGLangBootstrapPort() (int, error) {
	v, ok := e.Annotations[AnnotationSGLangBootstrapPort]
	if !ok {
		return DefaultSGLangBootstrapPort, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= 65535 {
		return n, nil
	}
	return 0, fmt.Errorf("annotation %s=%q is not a port number (1-65535)", AnnotationSGLangBootstrapPort, v)
}

// Endpoint is one routable address: a Ready pod at one of the pool's target ports.
// Endpoints are immutable once published in a Snapshot; sources build new ones on change.
type Endpoint struct {
	// Name and Namespace identify the pod.
	Name      string
	Namespace string
	// Address is the pod IP; Port the serving port (target port, or model.aibrix.ai/port).
	Address string
	Port    int32
	// Rank is the index of the target port in the pool (data-parallel rank), 0 for single-port pools.
	Rank int

	Labels      map[string]string
	Annotations map[string]string

	// Derived from labels by Classify.
	Role    Role
	Roleset string
	Engine  string
	Model   string
	// Revision is what the pair-match labels read on the pod (PairMatch.Revision); "" when
	// it carries none of them, or the endpoint was built without match labels.
	Revision string

	hostPort   string
	key        string
	rolesetKey string
	// memos are other packages' caches of what they keep under key (see Memo).
	memos [memoSlots]atomic.Pointer[memoSet]
}

// NewEndpoint builds an endpoint and derives its role, roleset, engine and model from the
// labels. It matches no pair labels (its Revision is ""); the pool sources build endpoints
// with PairMatch.NewEndpoint.
func NewEndpoint(namespace, name, address string, port int32, rank int, labels, annotations map[string]string) *Endpoint {
	return PairMatch(nil).NewEndpoint(namespace, name, address, port, rank, labels, annotations)
}

func newEndpoint(namespace, name, address string, port int32, rank int, labels, annotations map[string]string) *Endpoint {
	if labels == nil {
		labels = map[string]string{}
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	e := &Endpoint{
		Name: name, Namespace: namespace, Address: address, Port: port, Rank: rank,
		Labels: labels, Annotations: annotations,
	}
	e.Role, e.Roleset, e.Engine = Classify(labels)
	e.Model = labels[LabelModelName]
	e.hostPort = net.JoinHostPort(address, strconv.Itoa(int(port)))
	e.key = namespace + "/" + name + ":" + strconv.Itoa(int(port))
	return e
}

// HostPort is "ip:port", the form the Endpoint Picker Protocol uses on the wire.
func (e *Endpoint) HostPort() string { return e.hostPort }

// Key identifies the endpoint uniquely within Tandem: "namespace/pod:port".
func (e *Endpoint) Key() string { return e.key }

// PodKey identifies the pod: "namespace/name". Ledgers and trackers key pods by it.
func (e *Endpoint) PodKey() string { return e.Namespace + "/" + e.Name }

// RoleLabel is the role label in force on a pod, and its value: role-name when the pod sets
// it (the seed's label wins), else llm-d.ai/role ("" when that is absent too). Classify, the
// pool check, the role filters and the combined-pod test read the role through it, so the two
// labels are weighed one way everywhere.
func RoleLabel(labels map[string]string) (key, value string) {
	if v := labels[LabelRoleName]; v != "" {
		return LabelRoleName, v
	}
	return LabelLLMDRole, labels[LabelLLMDRole]
}

// RoutingSidecar reports a pod labelled as llm-d labels its P/D pods (llm-d.ai/role, any
// value): llm-d's decode pods carry its routing sidecar, which runs the prefill leg itself from
// the x-prefiller-host-port header.
func (e *Endpoint) RoutingSidecar() bool { return e.Labels[LabelLLMDRole] != "" }

// Classify reads a pod's role, roleset and engine from its labels.
// role-name wins over llm-d.ai/role (RoleLabel); anything that is neither prefill nor decode
// is standard. A missing engine label means vLLM, as the seed says.
func Classify(labels map[string]string) (role Role, roleset, engine string) {
	role = RoleStandard
	switch _, v := RoleLabel(labels); v {
	case "prefill":
		role = RolePrefill
	case "decode":
		role = RoleDecode
	}
	engine = labels[LabelEngine]
	if engine == "" {
		engine = EngineVLLM
	}
	return role, labels[LabelRolesetName], engine
}
