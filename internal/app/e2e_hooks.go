package app

// ServeMetricsOnFreePort makes New serve /metrics on a free port when MetricsPort is 0 (which
// otherwise disables it), so tests can run several Tandems side by side and read MetricsAddr.
// Added for the end-to-end tests (e2e/); the command line has no equivalent.
func (o *Options) ServeMetricsOnFreePort() { o.metricsAnyPort = true }
