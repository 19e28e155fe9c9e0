package request

import (
	"encoding/json"
	"slices"
	"strings"
)

// member is one top-level "key": value of a JSON object body.
type member struct {
	key        []byte // decoded: escapes such as \u005f resolved, as engines read it
	start, end int    // raw[start:end] is `"key": value`, exactly as sent
	value      int    // raw[value:end] is the value
}

// is reports whether the member's key is name (without allocating).
func (m member) is(name string) bool { return string(m.key) == name }

func (m member) isControl() bool {
	for _, f := range ControlFields {
		if m.is(f) {
			return true
		}
	}
	return false
}

// topLevel lists the members of a JSON object in one pass, without recursion, whatever the
// nesting depth (nested values are skipped by counting brackets outside strings, as TooDeep
// does), and how deep the object nests. ok is false when raw is not an object of that shape;
// values are not validated.
func topLevel(raw []byte) (members []member, depth int, ok bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return nil, 0, false
	}
	depth = 1
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return nil, depth, skipSpace(raw, i+1) == len(raw)
	}
	members = make([]member, 0, 8)
	for {
		if i >= len(raw) || raw[i] != '"' {
			return nil, 0, false
		}
		start := i
		keyEnd, escaped := stringEnd(raw, i)
		if keyEnd < 0 {
			return nil, 0, false
		}
		key := raw[i+1 : keyEnd-1]
		if escaped {
			var k string
			if err := json.Unmarshal(raw[i:keyEnd], &k); err != nil {
				return nil, 0, false
			}
			key = []byte(k)
		}
		i = skipSpace(raw, keyEnd)
		if i >= len(raw) || raw[i] != ':' {
			return nil, 0, false
		}
		value := skipSpace(raw, i+1)
		var d int
		i, d = valueEnd(raw, value)
		if i < 0 {
			return nil, 0, false
		}
		depth = max(depth, 1+d)
		members = append(members, member{key: key, start: start, value: value, end: i})
		i = skipSpace(raw, i)
		switch {
		case i < len(raw) && raw[i] == ',':
			i = skipSpace(raw, i+1)
		case i < len(raw) && raw[i] == '}':
			return members, depth, skipSpace(raw, i+1) == len(raw)
		default:
			return nil, 0, false
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

// valueEnd returns the index after the value starting at raw[i] (-1 if there is none) and how
// deep the value nests. Containers are skipped by depth counting; scalars run to the next ',',
// '}' or ']' (or space).
func valueEnd(raw []byte, i int) (end, depth int) {
	if i >= len(raw) {
		return -1, 0
	}
	switch raw[i] {
	case '"':
		end, _ := stringEnd(raw, i)
		return end, 0
	case '{', '[':
		d := 0
		for j := i; j < len(raw); j++ {
			switch raw[j] {
			case '"':
				end, _ := stringEnd(raw, j)
				if end < 0 {
					return -1, 0
				}
				j = end - 1
			case '{', '[':
				if d++; d > depth {
					depth = d
				}
			case '}', ']':
				if d--; d == 0 {
					return j + 1, depth
				}
			}
		}
		return -1, 0
	}
	j := i
	for j < len(raw) && !strings.ContainsRune(",}] \t\n\r", rune(raw[j])) {
		j++
	}
	if j == i {
		return -1, 0
	}
	return j, 0
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
		if m.isControl() && !slices.Contains(removed, string(m.key)) {
			removed = append(removed, string(m.key))
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
		if m.isControl() {
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
