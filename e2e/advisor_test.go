package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/advisor"
	"github.com/tandem-epp/tandem/internal/sim"
)

// The P:D ratio advisor on real traffic: requests through the gateway to simulated pods (two
// rolesets and a standard pod), then GET /advice on the metrics port says the model's pods by
// role, the requests it saw and a recommended split of the same five pods; the gauges say the
// same; anything but GET is refused.
func TestAdvisorOnRealTraffic(t *testing.T) {
	specs := append(pdPods("a", "b"), podSpec{name: "standard-0", role: sim.RoleStandard})
	s := newFileStack(t, nil, specs...)
	ctx := testCtx(t, 60*time.Second)
	const n = 30
	for i := 0; i < n; i++ {
		if r := s.post(ctx, "/v1/chat/completions", chatBody(prompt(s.marker("advice"), 300), 6, true), nil); r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d: %v", i, r)
		}
	}
	addr := s.tandem.MetricsAddr()

	var ad advisor.Advice
	eventually(t, "GET /advice to count the requests", func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/advice")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/json" {
			return false, resp.Status + " " + ct
		}
		var rep advisor.Report
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
			return false, err.Error()
		}
		if len(rep.Models) != 1 || rep.Models[0].Model != modelName {
			return false, "models: " + toJSON(rep.Models)
		}
		ad = rep.Models[0]
		return ad.Requests == n, toJSON(ad)
	})
	if want := (advisor.Split{Prefill: 2, Decode: 2, Standard: 1}); ad.Current != want {
		t.Errorf("current split %+v, want %+v", ad.Current, want)
	}
	// 30 requests are too few to move the advice (confidence below 0.5): it stands on the
	// current split.
	if ad.Confidence >= 0.5 || ad.Recommended != ad.Current {
		t.Errorf("30 requests: confidence %v, recommended %+v; want below 0.5 and the current split", ad.Confidence, ad.Recommended)
	}
	if ad.Rate <= 0 || ad.Saturation.Prefill <= 0 || ad.Binding == "" || ad.Fits.StepObservations == 0 {
		t.Errorf("advice rests on nothing: %s", toJSON(ad))
	}

	fams, err := tandemMetrics(addr)
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, role := range []string{"prefill", "decode", "standard"} {
		v, ok := metricValue(fams, "tandem_recommended_pods", map[string]string{"model": modelName, "role": role})
		if !ok {
			t.Fatalf("tandem_recommended_pods{role=%q} missing", role)
		}
		total += v
		if _, ok := metricValue(fams, "tandem_stage_saturation", map[string]string{"model": modelName, "stage": role}); !ok {
			t.Errorf("tandem_stage_saturation{stage=%q} missing", role)
		}
	}
	if total != 5 {
		t.Errorf("tandem_recommended_pods sum to %v, want the pool's 5 pods", total)
	}
	if v, ok := metricValue(fams, "tandem_advice_window_requests", map[string]string{"model": modelName}); !ok || v != n {
		t.Errorf("tandem_advice_window_requests = %v (present %v), want %d", v, ok, n)
	}

	resp, err := http.Post("http://"+addr+"/advice", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /advice: %s (Allow %q), want 405 with Allow: GET, HEAD", resp.Status, resp.Header.Get("Allow"))
	}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
