package request

import (
	"encoding/json"
	"slices"
	"strings"
)

// member is one top-level "key": value of a JSON object body.
type member struct {
	key        string // decoded: escapes such as \u005f resolved, as engines read it
	start, end int    // raw[start:end] is `"key": value`, exactly as sent
}

// topLevel lists the members of a JSON object in one pass, without recursion, whatever the
// nesting depth (nested values are skipped by counting brackets outside strings, as TooDeep
// does). ok is false when raw is not an object of that shape; values are not validated.
func topLevel(raw []byte) (members []member, ok bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return nil, false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return nil, skipSpace(raw, i+1) == len(raw)
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return nil, false
		}
		start := i
		keyEnd, escaped := stringEnd(raw, i)
		if keyEnd < 0 {
			return nil, false
		}
		key := string(raw[i+1 : keyEnd-1])
		if escaped {
			if err := json.Unmarshal(raw[i:keyEnd], &key); err != nil {
				return nil, false
			}
		}
		i = skipSpace(raw, keyEnd)
		if i >= len(raw) || raw[i] != ':' {
			return nil, false
		}
		i = valueEnd(raw, skipSpace(raw, i+1))
		if i < 0 {
			return nil, false
		}
		members = append(members, member{key: key, start: start, end: i})
		i = skipSpace(raw, i)
		switch {
		case i < len(raw) && raw[i] == ',':
			i = skipSpace(raw, i+1)
		case i < len(raw) && raw[i] == '}':
			return members, skipSpace(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}

func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the string opening at raw[i] ('"'), or -1; escaped says
// whether it holds a backslash.
func stringEnd(raw []byte, i int) (end int, escaped bool) {
	for j := i + 1; j < len(raw); j++ {
		switch raw[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, escaped
}

// valueEnd returns the index after the value starting at raw[i], or -1. Containers are skipped
// by depth counting; scalars run to the next ',', '}' or ']' (or space) at depth 0.
func valueEnd(raw []byte, i int) int {
	if i >= len(raw) {
		return -1
	}
	switch raw[i] {
	case '"':
		end, _ := stringEnd(raw, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(raw); j++ {
			switch raw[j] {
			case '"':
				end, _ := stringEnd(raw, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(raw) && !strings.ContainsRune(",}] \t\n\r", rune(raw[j])) {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// ControlFields are the top-level body fields that make an engine open a connection to a
// host the body names, or that hand PD state to it: vLLM's kv_transfer_params (remote_host,
// remote_port), AIBrix's NIXL disagg_prefill_resp (the prefill answer carrying them), SGLang's
// bootstrap_host, bootstrap_port and bootstrap_room, and TensorRT-LLM's disaggregated_params
// (ctx_info_endpoint, opaque state). Only Tandem's hand-off, or a decode-side sidecar, may
// write them.
var ControlFields = []string{"bootstrap_host", "bootstrap_port", "bootstrap_room", "disagg_prefill_resp",
	"disaggregated_params", "kv_transfer_params"}

// withoutControlFields returns raw without every occurrence of the ControlFields and the sorted
// names it removed; raw itself when there are none. Every other member is kept byte for byte,
// in order; only the separators between members are rewritten.
func withoutControlFields(raw []byte, members []member) ([]byte, []string) {
	var removed []string
	for _, m := range members {
		if slices.Contains(ControlFields, m.key) && !slices.Contains(removed, m.key) {
			removed = append(removed, m.key)
		}
	}
	if removed == nil {
		return raw, nil
	}
	slices.Sort(removed)
	out := make([]byte, 0, len(raw))
	out = append(out, '{')
	first := true
	for _, m := range members {
		if slices.Contains(ControlFields, m.key) {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, raw[m.start:m.end]...)
	}
	return append(out, '}'), removed
}
