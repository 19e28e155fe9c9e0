package pool

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tandem-epp/tandem/internal/suggest"
)

// Role label values that make a standard pod on purpose (the seed's example is "all", llm-d's
// both and prefill-decode); any other
// value than these, prefill and decode is most likely a typo, and Lint says so.
var standardRoleValues = []string{"all", "standard", "combined", "both", "prefill-decode"}

// Lint lists what in a pool's pods is probably a mistake though it routes: a role label value
// Tandem does not know (the pod silently becomes a standard pod), an engine label value it does
// not know or an SGLang bootstrap-port annotation that is no port (every PD request of the pod
// fails), a roleset with prefill pods but no decode pod or the other way round (it can never
// serve a PD pair), and pods the pair-match labels leave unpaired (their roleset has both
// sides, but not of their revision). Each line names the pods and the values Tandem knows. The
// result is sorted, so a caller can say each line once.
func Lint(snap *Snapshot) []string {
	var out []string
	seenPod := map[string]bool{}
	for _, e := range snap.Endpoints {
		pod := e.PodKey()
		if !seenPod[pod] {
			seenPod[pod] = true
			for _, w := range []string{roleValueWarning(pod, e.Labels), engineWarning(pod, e), bootstrapPortWarning(pod, e)} {
				if w != "" {
					out = append(out, w)
				}
			}
		}
	}
	groups := snap.Rolesets()
	split := map[*RolesetGroup]bool{}
	for _, g := range SplitByMatch(groups) {
		split[g] = true
	}
	for _, g := range groups {
		if g.Complete() {
			continue
		}
		name := fmt.Sprintf("roleset %q", g.Name)
		if g.Name == "" {
			name = "the pods without a " + LabelRolesetName + " label"
		}
		if g.Model != "" {
			name += fmt.Sprintf(" (model %q)", g.Model)
		}
		have, missing, pods := "prefill", "decode", g.Prefill
		if len(g.Decode) > 0 {
			have, missing, pods = "decode", "prefill", g.Decode
		}
		if split[g] {
			out = append(out, fmt.Sprintf("%s: %s pods (%s) of revision %s have no %s pod of the same revision, so the pair-match labels (TANDEM_PAIR_MATCH_LABELS) leave them unpaired until one joins them or the rollout ends",
				name, have, podNames(pods), g.Revision(), missing))
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s pods (%s) but no %s pod, so they serve no prefill/decode pair until a %s pod joins them",
			name, have, podNames(pods), missing, missing))
	}
	sort.Strings(out)
	return out
}

// podNames lists the pods of eps ("namespace/name", each once, sorted), comma-separated.
func podNames(eps []*Endpoint) string {
	pods := map[string]bool{}
	for _, e := range eps {
		pods[e.PodKey()] = true
	}
	return strings.Join(sortedKeys(pods), ", ")
}

// roleValueWarning says when a pod's role label holds a value Tandem does not know.
func roleValueWarning(pod string, labels map[string]string) string {
	label, v := RoleLabel(labels)
	switch v {
	case "", "prefill", "decode":
		return ""
	}
	for _, s := range standardRoleValues {
		if v == s {
			return ""
		}
	}
	hint := ""
	if r := suggest.Nearest(strings.ToLower(strings.TrimSpace(v)), []string{"prefill", "decode"}); r != "" {
		hint = fmt.Sprintf(" (did you mean %q?)", r)
	}
	return fmt.Sprintf("pod %s: %s=%q is not a role Tandem knows%s, so the pod is a standard pod; known values: prefill, decode, or %s (or no label) for a standard pod",
		pod, label, v, hint, strings.Join(standardRoleValues, ", "))
}

// engineWarning says when a pod's engine label holds a value Tandem does not know: its metrics
// are read as vLLM's and the EPP hand-off has no adapter for it.
func engineWarning(pod string, e *Endpoint) string {
	v := e.Labels[LabelEngine]
	if v == "" || slices.Contains(Engines, v) {
		return ""
	}
	hint := ""
	if r := suggest.Nearest(strings.ToLower(strings.TrimSpace(v)), Engines); r != "" {
		hint = fmt.Sprintf(" (did you mean %q?)", r)
	}
	return fmt.Sprintf("pod %s: %s=%q is not an engine Tandem knows%s: its metrics are read as vLLM's and the epp hand-off refuses its prefill/decode requests (503); known values: %s",
		pod, LabelEngine, v, hint, strings.Join(Engines, ", "))
}

// bootstrapPortWarning says when a pod's SGLang bootstrap-port annotation is no port number:
// every epp hand-off with the pod as its SGLang prefill pod fails.
func bootstrapPortWarning(pod string, e *Endpoint) string {
	if _, err := e.SGLangBootstrapPort(); err != nil {
		return fmt.Sprintf("pod %s: %v, so every prefill/decode request the pod prefills fails (503); fix it, or remove it for the default bootstrap port", pod, err)
	}
	return ""
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
