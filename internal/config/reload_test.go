package config

import (
	"slices"
	"testing"
)

func TestRestartOnlyNamesWhatAReloadCannotChange(t *testing.T) {
	for _, name := range restartOnly {
		if _, ok := VarByName(name); !ok {
			t.Errorf("%s is not a gateway setting", name)
		}
	}
	a, b := DefaultGateway(), DefaultGateway()
	b.PD.TRTMachineID = 7
	b.PD.PrefillLoadImbalanceMinSpread = 3 // read per request: not listed
	b.MetricRefreshInterval *= 2
	if got := RestartOnly(a, b); !slices.Equal(got, []string{"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS", "AIBRIX_TRT_MACHINE_ID"}) {
		t.Fatalf("%v", got)
	}
}
