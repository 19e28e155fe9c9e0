package metrics

import (
	"bytes"
	"strings"
	"testing"
)

// Histogram _sum and _count lines are read without the Prometheus parser: label escapes,
// timestamps, several series and engines, special values; malformed lines are errors that
// name the family.
func TestHistogramLines(t *testing.T) {
	page := strings.Join([]string{
		`# HELP h Help text.`,
		`# TYPE h histogram`,
		`h_bucket{le="0.1",a="x"} 3`,
		`h_sum{a="x",b="q\"uo\\te"} 1.5 1700000000000`,
		`h_count{a="x",b="q\"uo\\te"} 3`,
		`h_sum{a="y"} +Inf`,
		`h_count{a="y"} 2`,
		`h_sum 4`,
		`h_count 8`,
		`# TYPE g gauge`,
		`g 7`,
		`other_sum 1`,
	}, "\n") + "\n"
	var kept bytes.Buffer
	hist := &histAcc{}
	if err := filterLines([]byte(page), &kept, map[string]bool{"h": true, "g": true}, hist); err != nil {
		t.Fatal(err)
	}
	if got := kept.String(); got != "# TYPE g gauge\ng 7\n" {
		t.Errorf("lines for the parser:\n%s", got)
	}
	mf := hist.fams["h"]
	if mf == nil || len(mf.Metric) != 3 {
		t.Fatalf("family h: %v", mf)
	}
	m0 := mf.Metric[0]
	if m0.GetHistogram().GetSampleSum() != 1.5 || m0.GetHistogram().GetSampleCount() != 3 || len(m0.Label) != 2 ||
		m0.Label[1].GetName() != "b" || m0.Label[1].GetValue() != `q"uo\te` {
		t.Errorf("first series %v", m0)
	}
	if c := mf.Metric[2].GetHistogram(); c.GetSampleSum() != 4 || c.GetSampleCount() != 8 || len(mf.Metric[2].Label) != 0 {
		t.Errorf("unlabelled series %v", mf.Metric[2])
	}
	for _, bad := range []string{`h_sum{a="x" 1`, `h_sum{a=x} 1`, `h_sum{a="x"} one`, `h_sum{a="x"}`, `h_count{a="x"} 1 2 3`} {
		err := filterLines([]byte(bad+"\n"), &kept, map[string]bool{"h": true}, &histAcc{})
		if err == nil || !strings.Contains(err.Error(), "metrics line h") {
			t.Errorf("%s: error %v, want one naming the family", bad, err)
		}
	}
}
