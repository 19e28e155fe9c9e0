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

// A pd-predictive booking that is not finite, or ends further than an hour from Redis's now,
// is no replica's: +Inf made every predicted wait infinite and every pick fail.
func TestParseBusyUntilRefusesPoison(t *testing.T) {
	const now = 1_700_000_000.0
	for _, v := range []string{"inf", "+Inf", "-inf", "NaN", "nan", "1e300", "-1e300", "0", "1700003601", "x", ""} {
		if ahead, ok := parseBusyUntil(v, now); ok {
			t.Errorf("parseBusyUntil(%q) accepted %v", v, ahead)
		}
	}
	for v, want := range map[string]float64{"1700000002.5": 2.5, "1699999990": -10, "1700003600": 3600} {
		if ahead, ok := parseBusyUntil(v, now); !ok || ahead != want {
			t.Errorf("parseBusyUntil(%q) = %v, %v; want %v", v, ahead, ok, want)
		}
	}
}
