package redisledger

import "testing"

// A replica's field in the shared decode ledger that is not a finite, bounded charge is
// ignored, so one malformed or hostile field cannot make a pod's decode load infinite
// (never picked) or negative.
func TestParseValueRefusesMalformedCharges(t *testing.T) {
	for _, v := range []string{"+Inf,1,0", "NaN,1,0", "1e300,1,0", "-1,1,0", "1,-1,0", "1,1e300,0", "1,1,NaN", "1,1,+Inf", "1,1", "a,1,0"} {
		if _, _, _, ok := parseValue(v); ok {
			t.Errorf("parseValue(%q) accepted", v)
		}
	}
	tokens, count, sumAt, ok := parseValue("512,3,1700000000.5")
	if !ok || tokens != 512 || count != 3 || sumAt != 1700000000.5 {
		t.Errorf("parseValue of a well-formed charge: %v %v %v %v", tokens, count, sumAt, ok)
	}
}
