package pool

import (
	"fmt"
	"github.com/tandem-epp/tandem/internal/suggest"
	"sort"
	"strings"
)

// Role label values that make a standard pod on purpose (the seed's example is "all", llm-d's
// both and prefill-decode); any other
// value than these, prefill and decode is most likely a typo, and Lint says so.
var standardRoleValues = []string{"all", "standard", "combined", "both", "prefill-decode"}

// Lint lists what in a pool's pods is probably a mistake though it routes: a role label value
// Tandem does not know (the pod silently becomes a standard pod), and a roleset with prefill pods
// but no decode pod or the other way round (it can never serve a PD pair). Each line names the
// pods and the values Tandem knows. The result is sorted, so a caller can say each line once.
func Lint(endpoints []*Endpoint) []string {
	var out []string
	type sides struct{ prefill, decode map[string]bool }
	rolesets := map[string]*sides{}
	seenPod := map[string]bool{}
	for _, e := range endpoints {
		pod := e.PodKey()
		if !seenPod[pod] {
			seenPod[pod] = true
			if w := roleValueWarning(pod, e.Labels); w != "" {
				out = append(out, w)
			}
		}
		if e.Role != RolePrefill && e.Role != RoleDecode {
			continue
		}
		key := e.Model + "\x00" + e.Roleset
		s := rolesets[key]
		if s == nil {
			s = &sides{map[string]bool{}, map[string]bool{}}
			rolesets[key] = s
		}
		if e.Role == RolePrefill {
			s.prefill[pod] = true
		} else {
			s.decode[pod] = true
		}
	}
	for key, s := range rolesets {
		if len(s.prefill) > 0 && len(s.decode) > 0 {
			continue
		}
		model, roleset, _ := strings.Cut(key, "\x00")
		name := fmt.Sprintf("roleset %q", roleset)
		if roleset == "" {
			name = "the pods without a " + LabelRolesetName + " label"
		}
		if model != "" {
			name += fmt.Sprintf(" (model %q)", model)
		}
		have, missing, pods := "prefill", "decode", s.prefill
		if len(s.decode) > 0 {
			have, missing, pods = "decode", "prefill", s.decode
		}
		out = append(out, fmt.Sprintf("%s: %s pods (%s) but no %s pod, so they serve no prefill/decode pair until a %s pod joins them",
			name, have, strings.Join(sortedKeys(pods), ", "), missing, missing))
	}
	sort.Strings(out)
	return out
}

// roleValueWarning says when a pod's role label holds a value Tandem does not know.
func roleValueWarning(pod string, labels map[string]string) string {
	label, v := LabelRoleName, labels[LabelRoleName]
	if v == "" {
		label, v = LabelLLMDRole, labels[LabelLLMDRole]
	}
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

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
