package metrics

import (
	"math"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// reading is what one scrape found, before it is combined with the previous scrape into a Sample.
type reading struct {
	at time.Time

	running, waiting, kvUsage, genGauge        float64
	hasRunning, hasWaiting, hasKV, hasGenGauge bool

	genTokens    float64 // counter
	hasGenTokens bool

	promptTokens    float64 // counter
	hasPromptTokens bool

	// histogram totals: prefill, queue, TTFT and inter-token time
	hists [numHists]histTotals

	prefillPrealloc, decodePrealloc float64
	hasPrefillPrealloc              bool
	hasDecodePrealloc               bool

	blockSize, numBlocks int
}

// extract reads the mapping's signals from parsed families.
func extract(fams map[string]*dto.MetricFamily, m *mapping, at time.Time) reading {
	r := reading{at: at}
	r.running, r.hasRunning = sumOf(fams, m.sel[FieldRunning])
	r.waiting, r.hasWaiting = sumOf(fams, m.sel[FieldWaiting])
	r.kvUsage, r.hasKV = meanOf(fams, m.sel[FieldKVUsage])
	r.genGauge, r.hasGenGauge = sumOf(fams, m.sel[FieldGenThroughput])
	r.genTokens, r.hasGenTokens = sumOf(fams, m.sel[FieldGenTokens])
	r.promptTokens, r.hasPromptTokens = sumOf(fams, m.sel[FieldPromptTokens])
	for i, f := range histFields {
		h := &r.hists[i]
		h.sum, h.count, h.ok = histogramTotals(fams, m.sel[f])
	}
	r.prefillPrealloc, r.hasPrefillPrealloc = sumOf(fams, m.sel[FieldPrefillPrealloc])
	r.decodePrealloc, r.hasDecodePrealloc = sumOf(fams, m.sel[FieldDecodePrealloc])

	if bs, ok := sumOf(fams, m.sel[FieldBlockSize]); ok {
		r.blockSize = int(bs)
	}
	if nb, ok := sumOf(fams, m.sel[FieldNumBlocks]); ok {
		r.numBlocks = int(nb)
	}
	// cache_config_info: block size is per engine and the same on all; blocks add up over engines.
	if r.blockSize == 0 || r.numBlocks == 0 {
		bs, nb := cacheInfo(fams, m)
		if r.blockSize == 0 {
			r.blockSize = bs
		}
		if r.numBlocks == 0 {
			r.numBlocks = nb
		}
	}
	return r
}

// series returns the first selector's family that is present, with the series it selects.
func series(fams map[string]*dto.MetricFamily, sels []Selector) []*dto.Metric {
	for _, s := range sels {
		mf, ok := fams[s.Name]
		if !ok {
			continue
		}
		if len(s.Labels) == 0 {
			return mf.GetMetric()
		}
		var out []*dto.Metric
		for _, m := range mf.GetMetric() {
			if hasLabels(m, s.Labels) {
				out = append(out, m)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// value reads a gauge, counter or untyped series.
func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// sumOf adds the selected series: engines of one server (vLLM V1 "engine" label, SGLang ranks)
// each report their own share of the pod's requests. NaN and infinite values are not readings.
func sumOf(fams map[string]*dto.MetricFamily, sels []Selector) (float64, bool) {
	sum, n := total(fams, sels)
	return sum, n > 0
}

// meanOf averages the selected series: each engine reports the utilisation of its own KV
// cache, so the pod's utilisation is their mean (engines of one pod have equal caches).
func meanOf(fams map[string]*dto.MetricFamily, sels []Selector) (float64, bool) {
	sum, n := total(fams, sels)
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

// total adds the finite values of the selected series and counts them.
func total(fams map[string]*dto.MetricFamily, sels []Selector) (sum float64, n int) {
	for _, m := range series(fams, sels) {
		if v := value(m); !math.IsNaN(v) && !math.IsInf(v, 0) {
			sum += v
			n++
		}
	}
	return sum, n
}

func histogramTotals(fams map[string]*dto.MetricFamily, sels []Selector) (sum, count float64, ok bool) {
	for _, m := range series(fams, sels) {
		if h := m.GetHistogram(); h != nil {
			sum += h.GetSampleSum()
			count += float64(h.GetSampleCount())
			ok = true
		}
	}
	return sum, count, ok
}

func cacheInfo(fams map[string]*dto.MetricFamily, m *mapping) (blockSize, numBlocks int) {
	for _, s := range series(fams, m.sel[FieldCacheInfo]) {
		for _, lp := range s.GetLabel() {
			n, err := strconv.Atoi(lp.GetValue())
			if err != nil {
				continue // vLLM writes "None" for unset values
			}
			switch lp.GetName() {
			case m.blockSizeLabel:
				if blockSize == 0 {
					blockSize = n
				}
			case m.numBlocksLabel:
				numBlocks += n
			}
		}
	}
	return blockSize, numBlocks
}

// toSample combines a reading with the previous good one: throughput from the generation-token
// counter and the prefill-time mean over the interval need two scrapes.
func toSample(cur reading, prev *reading, prevSample *Sample) *Sample {
	s := &Sample{
		Running: cur.running, HasRunning: cur.hasRunning,
		Waiting: cur.waiting, HasWaiting: cur.hasWaiting,
		KVUsage: cur.kvUsage, HasKVUsage: cur.hasKV,
		BlockSize: cur.blockSize, NumGPUBlocks: cur.numBlocks,
		PromptTokens: cur.promptTokens, HasPromptTokens: cur.hasPromptTokens,
		UpdatedAt: cur.at,
	}
	if cur.hasPrefillPrealloc || cur.hasDecodePrealloc {
		s.PrefillPreallocQueue, s.DecodePreallocQueue, s.HasPreallocQueues = cur.prefillPrealloc, cur.decodePrealloc, true
	}

	switch {
	case cur.hasGenGauge:
		s.GenThroughput, s.HasGenThroughput = cur.genGauge, true
	case cur.hasGenTokens && prev != nil && prev.hasGenTokens:
		if dt := cur.at.Sub(prev.at).Seconds(); dt > 0 {
			delta := cur.genTokens - prev.genTokens
			if delta < 0 { // the engine restarted: its counter began again at zero
				delta = cur.genTokens
			}
			s.GenThroughput, s.HasGenThroughput = delta/dt, true
		}
	}

	s.HistogramsLifetime = prev == nil
	for i := range histFields {
		var prevH *histTotals
		if prev != nil {
			prevH = &prev.hists[i]
		}
		var prevMean float64
		var prevHas bool
		if prevSample != nil {
			prevMean, prevHas = histMean(prevSample, i)
		}
		mean, count, ok := intervalMean(cur.hists[i], prevH, prevMean, prevHas)
		setHist(s, i, mean, count, ok)
	}
	return s
}

// The histograms a sample reports as interval means, in reading.hists order.
const (
	histPrefill = iota
	histQueue
	histTTFT
	histInterToken
	numHists
)

var histFields = [numHists]Field{FieldPrefillTime, FieldQueueTime, FieldTTFT, FieldInterToken}

type histTotals struct {
	sum, count float64
	ok         bool
}

// intervalMean is the mean of the observations since the previous scrape, and how many
// there were. None in the interval: the last known mean still stands (count 0). No
// previous scrape: the lifetime mean.
func intervalMean(cur histTotals, prev *histTotals, prevMean float64, prevHas bool) (mean, count float64, ok bool) {
	if !cur.ok {
		return 0, 0, false
	}
	switch {
	case prev != nil && prev.ok && cur.count > prev.count:
		// Follows load changes, where the lifetime mean would hardly move on a long-running engine.
		n := cur.count - prev.count
		return (cur.sum - prev.sum) / n, n, true
	case prev != nil && prev.ok && cur.count == prev.count && prevHas:
		return prevMean, 0, true
	case cur.count > 0:
		return cur.sum / cur.count, cur.count, true
	}
	return 0, 0, false
}

func histMean(s *Sample, i int) (float64, bool) {
	switch i {
	case histPrefill:
		return s.PrefillTimeMean, s.HasPrefillTimeMean
	case histQueue:
		return s.QueueTimeMean, s.HasQueueTimeMean
	case histTTFT:
		return s.TTFTMean, s.HasTTFTMean
	}
	return s.InterTokenMean, s.HasInterTokenMean
}

func setHist(s *Sample, i int, mean, count float64, ok bool) {
	switch i {
	case histPrefill:
		s.PrefillTimeMean, s.PrefillCount, s.HasPrefillTimeMean = mean, count, ok
	case histQueue:
		s.QueueTimeMean, s.QueueCount, s.HasQueueTimeMean = mean, count, ok
	case histTTFT:
		s.TTFTMean, s.TTFTCount, s.HasTTFTMean = mean, count, ok
	default:
		s.InterTokenMean, s.InterTokenCount, s.HasInterTokenMean = mean, count, ok
	}
}
