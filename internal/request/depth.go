package request

// MaxJSONDepth bounds how deeply a request body may nest arrays and objects. gjson validates
// and walks JSON recursively: a 10 MiB body of "[" would overflow the goroutine stack, a fatal
// error that ends the whole process (recover cannot catch it). Real OpenAI bodies nest a few
// levels; tool schemas a few dozen.
const MaxJSONDepth = 512

// TooDeep reports whether raw opens more than max nested arrays or objects, counting only
// brackets outside JSON strings. It scans once, without recursion, whatever raw holds: a stray
// closer never lowers the count below zero, so invalid input is judged conservatively.
func TooDeep(raw []byte, max int) bool {
	depth := 0
	inString, escaped := false, false
	for _, c := range raw {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			if depth++; depth > max {
				return true
			}
		case ']', '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return false
}
