package pool

import (
	"strings"
	"testing"
)

// lint is Lint over a snapshot of eps.
func lint(eps ...*Endpoint) []string { return Lint(NewStore().Publish(Info{}, eps, true)) }

func TestLintNamesRoleTyposAndOneSidedRolesets(t *testing.T) {
	ep := func(name string, labels map[string]string) *Endpoint {
		return NewEndpoint("ns", name, "10.0.0.1", 8000, 0, labels, nil)
	}
	got := lint(
		ep("p0", map[string]string{LabelRoleName: "prefill", LabelRolesetName: "rs0", LabelModelName: "m"}),
		ep("d0", map[string]string{LabelRoleName: "decode", LabelRolesetName: "rs0", LabelModelName: "m"}),
		ep("typo", map[string]string{LabelRoleName: "prefil", LabelRolesetName: "rs1", LabelModelName: "m"}),
		ep("d1", map[string]string{LabelRoleName: "decode", LabelRolesetName: "rs1", LabelModelName: "m"}),
		ep("std", map[string]string{LabelRoleName: "all", LabelModelName: "m"}),
		ep("plain", nil),
		ep("llmd", map[string]string{LabelLLMDRole: "prefil-decode"}),
	)
	want := []string{
		`pod ns/llmd: llm-d.ai/role="prefil-decode" is not a role Tandem knows, so the pod is a standard pod; known values: prefill, decode, or all, standard, combined, both, prefill-decode (or no label) for a standard pod`,
		`pod ns/typo: role-name="prefil" is not a role Tandem knows (did you mean "prefill"?), so the pod is a standard pod; known values: prefill, decode, or all, standard, combined, both, prefill-decode (or no label) for a standard pod`,
		`roleset "rs1" (model "m"): decode pods (ns/d1) but no prefill pod, so they serve no prefill/decode pair until a prefill pod joins them`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Lint:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := lint(ep("p", map[string]string{LabelRoleName: "prefill"})); len(got) != 1 ||
		!strings.HasPrefix(got[0], "the pods without a roleset-name label: prefill pods (ns/p) but no decode pod") {
		t.Errorf("implicit roleset: %q", got)
	}
}

// An engine label Tandem does not know, and an SGLang bootstrap port that is no port, are named
// with what they break; known values and good ports say nothing.
func TestLintNamesBadEnginesAndBootstrapPorts(t *testing.T) {
	ep := func(name string, labels, annotations map[string]string) *Endpoint {
		labels[LabelRoleName], labels[LabelRolesetName] = "standard", "rs"
		return NewEndpoint("ns", name, "10.0.0.1", 8000, 0, labels, annotations)
	}
	got := lint(
		ep("upper", map[string]string{LabelEngine: "VLLM"}, nil),
		ep("ok", map[string]string{LabelEngine: "sglang"}, map[string]string{AnnotationSGLangBootstrapPort: "8998"}),
		ep("port", map[string]string{LabelEngine: "sglang"}, map[string]string{AnnotationSGLangBootstrapPort: "abc"}),
		ep("none", map[string]string{}, nil),
	)
	want := []string{
		`pod ns/port: annotation model.aibrix.ai/sglang-bootstrap-port="abc" is not a port number (1-65535), so every prefill/decode request the pod prefills fails (503); fix it, or remove it for the default bootstrap port`,
		`pod ns/upper: model.aibrix.ai/engine="VLLM" is not an engine Tandem knows (did you mean "vllm"?): its metrics are read as vLLM's and the epp hand-off refuses its prefill/decode requests (503); known values: vllm, sglang, trtllm`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Lint:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
