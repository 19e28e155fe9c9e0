package request

import (
	"strings"
	"unicode/utf8"
)

// Bounds of the client strings Tandem reads. Past them a value is cut (never refused: no pod
// can be selected by a longer one anyway, Kubernetes label values stop at 63 bytes).
const (
	// MaxHeaderValueBytes bounds each header in ReadHeaders. It is above the session key's
	// 256 bytes, so a longer key is still recognised as too long and ignored, as the seed says.
	MaxHeaderValueBytes = 1024
	// MaxModelBytes bounds Request.Model.
	MaxModelBytes = 256
)

// ReadHeaders are the request headers Tandem itself reads: they become metric labels, log
// fields, SGLang rids and upstream headers. (routing-strategy and config-profile are
// config.HeaderRoutingStrategy and config.HeaderConfigProfile; config imports this package,
// so the names are repeated here and a test in extproc checks they agree.)
var ReadHeaders = []string{"x-request-id", "routing-strategy", "config-profile", HeaderSessionKey}

// cleanHeaders makes each of ReadHeaders in h safe, in place.
func cleanHeaders(h map[string]string) {
	for _, k := range ReadHeaders {
		if v, ok := h[k]; ok {
			if c := clean(v, MaxHeaderValueBytes); c != v {
				h[k] = c
			}
		}
	}
}

// clean returns s as valid UTF-8 (each invalid byte sequence replaced by U+FFFD) of at most
// max bytes, cut at a rune boundary. It does not allocate when s is already safe.
func clean(s string, max int) string {
	if len(s) <= max && utf8.ValidString(s) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
