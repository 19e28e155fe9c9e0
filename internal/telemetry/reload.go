package telemetry

import "github.com/prometheus/client_golang/prometheus"

// configReload are the --config-file reload metrics.
type configReload struct {
	total   *prometheus.CounterVec
	applied prometheus.Gauge
}

func (m *Metrics) newConfigReload() configReload {
	return configReload{
		total:   m.counterVec("tandem_config_reloads_total", "Changes of the --config-file seen while running, by result: applied, or rejected (the last good configuration keeps routing; the log says what is wrong).", "result"),
		applied: m.gauge("tandem_config_file_applied", "1 when the --config-file's current content is the configuration routing; 0 after a change was rejected (and without a --config-file)."),
	}
}

// ConfigReload records one reload of the --config-file.
func (m *Metrics) ConfigReload(applied bool) {
	result, v := "rejected", 0.0
	if applied {
		result, v = "applied", 1
	}
	m.configReload.total.WithLabelValues(result).Inc()
	m.configReload.applied.Set(v)
}

// ConfigFileLoaded records that the --config-file loaded at start is the one routing.
func (m *Metrics) ConfigFileLoaded() { m.configReload.applied.Set(1) }
