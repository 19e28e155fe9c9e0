package main

import (
	"fmt"
	"strconv"
	"time"
)

// modelName is what every simulated pod serves and every request names.
const modelName = "sim-model"

// engine is the latency model every llm-d simulator of the run is started with (its
// per-token calculator): prefill = overhead + prompt × per-token, each token after the first
// one inter-token latency, a decode leg's KV transfer = prompt × transfer per token, each
// with a standard deviation; the GPU-bound terms grow linearly with the running requests up to
// timeFactor at maxNumSeqs.
type engine struct {
	prefillOverhead, prefillPerToken, prefillStd time.Duration
	itl, itlStd                                  time.Duration
	kvPerToken, kvStd                            time.Duration
	timeFactor                                   float64
	maxNumSeqs                                   int
	maxModelLen                                  int
}

// defaultEngine is a mid-size model on one GPU: 20k prompt tokens/s, a 10 ms decode step
// alone and 60 ms at a full batch of 16 (so the 50 ms TPOT objective is missed beyond 13
// running requests, the tight 20 ms one beyond 4), KV at 200k tokens/s.
var defaultEngine = engine{
	prefillOverhead: 5 * time.Millisecond, prefillPerToken: 50 * time.Microsecond, prefillStd: 5 * time.Millisecond,
	itl: 10 * time.Millisecond, itlStd: 10 * time.Millisecond * itlStdPercent / 100,
	kvPerToken: 5 * time.Microsecond, kvStd: time.Millisecond,
	timeFactor: 6, maxNumSeqs: 16, maxModelLen: 16384,
}

// itlStdPercent is the inter-token latency's standard deviation, in percent of it (the
// simulator refuses more than 30).
const itlStdPercent = 15

// saturation is the requests per second whole-request pods complete with every slot busy
// (each request then takes timeFactor times its idle time): the highest rate routing whole
// requests can sustain, the reference the loads are fractions of.
func (e engine) saturation(reqs []request, wholePods int) float64 {
	var t float64
	for _, q := range reqs {
		t += (e.idlePrefill(q.prompt) + float64(q.out-1)*e.itl.Seconds()) * e.timeFactor
	}
	return float64(wholePods*e.maxNumSeqs) / (t / float64(len(reqs)))
}

// idlePrefill is a prompt's prefill on an idle pod, in seconds (the SLO's reference).
func (e engine) idlePrefill(prompt int) float64 {
	return (e.prefillOverhead + time.Duration(prompt)*e.prefillPerToken).Seconds()
}

// args are the simulator's command line for one pod.
func (e engine) args(port int, seed int64) []string {
	d := func(x time.Duration) string { return x.String() }
	return []string{
		"--port", strconv.Itoa(port),
		"--model", modelName,
		"--force-dummy-tokenizer",
		"--mode", "random",
		"--seed", strconv.FormatInt(seed, 10),
		"--max-num-seqs", strconv.Itoa(e.maxNumSeqs),
		"--max-model-len", strconv.Itoa(e.maxModelLen),
		"--max-waiting-queue-length", "100000",
		"--latency-calculator", "per-token",
		"--prefill-overhead", d(e.prefillOverhead),
		"--prefill-time-per-token", d(e.prefillPerToken),
		"--prefill-time-std-dev", d(e.prefillStd),
		"--inter-token-latency", d(e.itl),
		"--inter-token-latency-std-dev", d(e.itlStd),
		"--kv-cache-transfer-time-per-token", d(e.kvPerToken),
		"--kv-cache-transfer-time-std-dev", d(e.kvStd),
		"--time-factor-under-load", strconv.FormatFloat(e.timeFactor, 'g', -1, 64),
	}
}

// describe is the engine's line in the report.
func (e engine) describe() string {
	return fmt.Sprintf("prefill %v + %v/token (std %v), inter-token %v (std %v), KV transfer %v/token (std %v), "+
		"time factor under load %.2g at max-num-seqs %d, max-model-len %d",
		e.prefillOverhead, e.prefillPerToken, e.prefillStd, e.itl, e.itlStd, e.kvPerToken, e.kvStd,
		e.timeFactor, e.maxNumSeqs, e.maxModelLen)
}

// sloSpec is bench/quality's SLO: TTFT at most max(ttft, ttftPrefill × the request's own
// idle-pod prefill), TPOT at most tpot (two objectives: 50 ms and the tight 20 ms). tpots[0]
// is the objective every request carries (-slo-tpot).
type sloSpec struct {
	ttft, ttftPrefill float64
	tpots             []float64
}

var defaultSLO = sloSpec{ttft: 1.0, ttftPrefill: 3.0, tpots: []float64{0.050, 0.020}}

func (s sloSpec) ttftFor(idlePrefill float64) float64 { return max(s.ttft, s.ttftPrefill*idlePrefill) }
