// Package metrics owns what Tandem learns by scraping model servers (vLLM, SGLang,
// TensorRT-LLM): the Scraper, the engine dialects, and one immutable Sample per endpoint,
// refreshed on an interval and marked stale when a pod stops answering. It must not decide
// anything (scorers read Samples) nor register Prometheus metrics (it reports to an Observer).
package metrics

import (
	"sync"
	"time"
)

// Sample is the last scrape of one endpoint. Fields whose metric the engine did not export
// (or that went stale) have their Has* flag false: the seed's policies treat missing metrics
// explicitly, so a zero value must never be mistaken for a reading.
type Sample struct {
	Running    float64 // requests running in the engine
	HasRunning bool
	Waiting    float64 // requests queued in the engine
	HasWaiting bool
	// KVUsage is the KV-cache utilisation, 0..1.
	KVUsage    float64
	HasKVUsage bool
	// GenThroughput is generation throughput in tokens/s (a gauge where the engine exports
	// one, else derived from the generation-token counter between two scrapes).
	GenThroughput    float64
	HasGenThroughput bool
	// PromptTokens is the engine's counter of prompt tokens processed over its life: with
	// the lifetime prefill-time (or TTFT) count, the mean prompt of what it served before
	// Tandem saw it.
	PromptTokens    float64
	HasPromptTokens bool
	// PrefillTimeMean is the mean of the prefill-time histogram, in seconds: over the
	// prefills finished since the previous scrape when some did (PrefillCount of them),
	// else the last such mean (PrefillCount 0).
	PrefillTimeMean    float64
	HasPrefillTimeMean bool
	PrefillCount       float64
	// QueueTimeMean, TTFTMean and InterTokenMean are the interval means of the engine's
	// queue-time, time-to-first-token and inter-token-latency histograms, in seconds, with
	// the same rule (QueueCount, TTFTCount, InterTokenCount observations in the interval).
	QueueTimeMean, TTFTMean, InterTokenMean          float64
	HasQueueTimeMean, HasTTFTMean, HasInterTokenMean bool
	QueueCount, TTFTCount, InterTokenCount           float64
	// HistogramsLifetime: there was no earlier scrape of the endpoint to difference against,
	// so the histogram means and counts are over the engine's whole life (the first scrape
	// after Tandem starts or the endpoint appears), not over an interval.
	HistogramsLifetime bool
	// SGLang prealloc queues, used by the combined-pod score.
	PrefillPreallocQueue float64
	DecodePreallocQueue  float64
	HasPreallocQueues    bool
	// BlockSize and NumGPUBlocks from cache_config_info, when exported.
	BlockSize    int
	NumGPUBlocks int

	// UpdatedAt is when this sample was scraped; Stale is set once scrapes have failed for
	// longer than the staleness threshold, in which case every Has* flag is false.
	UpdatedAt time.Time
	Stale     bool
}

// Store holds the latest Sample per endpoint key. Readers never block writers for long.
type Store struct {
	m sync.Map // endpoint key -> *Sample
}

// NewStore returns an empty store.
func NewStore() *Store { return &Store{} }

// Get returns the latest sample of an endpoint, or nil if it was never scraped.
func (s *Store) Get(key string) *Sample {
	if v, ok := s.m.Load(key); ok {
		return v.(*Sample)
	}
	return nil
}

// Put publishes a new sample for an endpoint. Samples are immutable once put.
func (s *Store) Put(key string, smp *Sample) { s.m.Store(key, smp) }

// Delete forgets an endpoint (it left the pool).
func (s *Store) Delete(key string) { s.m.Delete(key) }

// Keys lists the endpoints with a sample.
func (s *Store) Keys() []string {
	var keys []string
	s.m.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
	return keys
}
