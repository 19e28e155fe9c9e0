package latency

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/tandem-epp/tandem/internal/metrics"
	"github.com/tandem-epp/tandem/internal/outcome"
)

// fifoScenario is a prefill pod serving prompts one at a time in arrival order: Tandem's
// (routed whole, so the models see them) and other clients' (only the engine's metrics
// show them).
type fifoScenario struct {
	name             string
	ownRate, ownSvc  float64 // Tandem's arrivals per second, each's prefill seconds
	extRate, extSvc  float64 // the others'
	extOn, extOff    float64 // >0: the others come in bursts of extOn seconds every extOn+extOff
	duration, warmUp float64
	scrape           float64 // seconds between scrapes
	ownTokens        int
	seed             uint64
}

type fifoJob struct {
	own                bool
	arrive, start, end float64
	tr                 *outcome.Tracker
	predicted          float64
}

// fifoResult is how far the predicted waits of Tandem's prompts were from their true waits.
type fifoResult struct {
	mae, bias, meanWait float64
	service             float64 // the own prompt's predicted prefill at the end
	n                   int
}

// runFIFO plays sc against fresh models (on the manual clock) and scores the predicted
// waits. The engine's samples carry its running and waiting gauges and the queue-time
// histogram's interval mean, as the scraper derives them.
func runFIFO(t *testing.T, sc fifoScenario) fifoResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(sc.seed, 7))
	var jobs []*fifoJob
	for at := rng.ExpFloat64() / sc.ownRate; at < sc.duration; at += rng.ExpFloat64() / sc.ownRate {
		jobs = append(jobs, &fifoJob{own: true, arrive: at})
	}
	if sc.extRate > 0 {
		for at := rng.ExpFloat64() / sc.extRate; at < sc.duration; at += rng.ExpFloat64() / sc.extRate {
			if sc.extOn > 0 && math.Mod(at, sc.extOn+sc.extOff) >= sc.extOn {
				continue
			}
			jobs = append(jobs, &fifoJob{arrive: at})
		}
	}
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].arrive < jobs[j].arrive })
	free := 0.0
	for _, j := range jobs {
		svc := sc.extSvc
		if j.own {
			svc = sc.ownSvc
		}
		j.start = math.Max(j.arrive, free)
		j.end = j.start + svc
		free = j.end
	}
	// The events in time order: arrivals, Tandem's first bytes, scrapes.
	type event struct {
		at   float64
		kind int // 0 scrape, 1 own end, 2 own arrival
		job  *fifoJob
	}
	var evs []event
	for _, j := range jobs {
		if j.own {
			evs = append(evs, event{j.arrive, 2, j}, event{j.end, 1, j})
		}
	}
	for at := sc.scrape; at < sc.duration; at += sc.scrape {
		evs = append(evs, event{at, 0, nil})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })

	r := newRig(Options{})
	key := "ns/p:1"
	lastScrape := 0.0
	var res fifoResult
	for _, e := range evs {
		r.clock.Set(t0.Add(secs(e.at)))
		switch e.kind {
		case 2:
			p := Prompt{Tokens: sc.ownTokens}
			e.job.tr = r.rec.Start(outcome.KindWhole, "", key, p.Tokens)
			f := r.m.Forecast(key)
			e.job.predicted = f.Wait()
			r.m.Charge(e.job.tr.ID(), Charge{Kind: outcome.KindWhole, Prefill: key, Destination: key, Prompt: p, Service: f.Service(p)})
		case 1:
			e.job.tr.Chunk(1)
			e.job.tr.End(nil)
			if e.job.arrive >= sc.warmUp {
				err := e.job.predicted - (e.job.start - e.job.arrive)
				res.mae += math.Abs(err)
				res.bias += err
				res.meanWait += e.job.start - e.job.arrive
				res.n++
			}
		case 0:
			var waiting, running, qsum, qn float64
			for _, j := range jobs {
				if j.arrive <= e.at && j.start > e.at {
					waiting++
				}
				if j.start <= e.at && j.end > e.at {
					running++
				}
				if j.start > lastScrape && j.start <= e.at {
					qsum += j.start - j.arrive
					qn++
				}
			}
			s := &metrics.Sample{Waiting: waiting, HasWaiting: true, Running: running, HasRunning: true, UpdatedAt: r.clock.Now()}
			if qn > 0 {
				s.QueueTimeMean, s.QueueCount, s.HasQueueTimeMean = qsum/qn, qn, true
			}
			r.m.Ingest(key, s)
			lastScrape = e.at
		}
	}
	f := r.m.Forecast(key)
	res.service = f.Service(Prompt{Tokens: sc.ownTokens})
	n := float64(res.n)
	res.mae, res.bias, res.meanWait = res.mae/n, res.bias/n, res.meanWait/n
	return res
}

// A pod that others route to as well (another replica without a shared store, or clients
// that bypass the gateway): the engine's queue-time histogram measures the wait their work
// adds, whatever their prompts, so the predicted wait of Tandem's prompts is off on average
// by at most 25 % of the mean true wait (1–21 % here), where the waiting count alone (Tandem's mean prompt
// per waiting request, drained since the scrape) predicted 43–74 % too little. When Tandem
// routes everything, the histogram adds nothing: the predictions are the ledger's, exact here.
func TestQueueHistogramMeasuresUnseenWait(t *testing.T) {
	for _, sc := range []fifoScenario{
		{name: "tandem-only", ownRate: 5, ownSvc: 0.1},
		{name: "others-same-prompts", ownRate: 3, ownSvc: 0.1, extRate: 3, extSvc: 0.1},
		{name: "others-long-prompts", ownRate: 3, ownSvc: 0.05, extRate: 1, extSvc: 0.4},
		{name: "others-in-bursts", ownRate: 2, ownSvc: 0.05, extRate: 4, extSvc: 0.2, extOn: 10, extOff: 10},
	} {
		sc.duration, sc.warmUp, sc.scrape, sc.ownTokens, sc.seed = 600, 30, 1, 2000, 1
		res := runFIFO(t, sc)
		t.Logf("%-20s predicted wait: MAE %.4f s, bias %+.4f s; mean true wait %.4f s over %d prompts; predicted prefill %.4f s (true %.4f)",
			sc.name, res.mae, res.bias, res.meanWait, res.n, res.service, sc.ownSvc)
		if sc.extRate == 0 {
			if res.mae > 1e-3 {
				t.Errorf("%s: Tandem routed everything, yet the predicted waits are off by %.4f s on average: the histogram counted the ledger's waits again", sc.name, res.mae)
			}
			continue
		}
		if math.Abs(res.bias) > 0.25*res.meanWait {
			t.Errorf("%s: predicted waits off by %+.4f s on average (mean true wait %.4f s): want within 25 %%", sc.name, res.bias, res.meanWait)
		}
	}
}

// An SGLang prefill pod behind a decode-side sidecar: SGLang exports no prefill-time
// histogram, so Tandem, which only infers the legs' ends there, fits the prefill model on
// the engine's time to first token less its queue time over each interval.
func TestSGLangPrefillFromTTFTLessQueue(t *testing.T) {
	var smp *metrics.Sample
	r := newRig(Options{Samples: func(string) *metrics.Sample { return smp }})
	p, d := "ns/p:1", "ns/d:1"
	rng := rand.New(rand.NewPCG(3, 3))
	for range 200 {
		var svc, queue float64
		for range 3 {
			pr := Prompt{Tokens: 500 + rng.IntN(12000)}
			tr := r.rec.Start(outcome.KindPD, p, d, pr.Tokens)
			r.m.Charge(tr.ID(), Charge{Kind: outcome.KindPD, Prefill: p, Destination: d, Prompt: pr, Service: 0.1})
			s := trueService(pr, 1)
			svc += s
			queue += 0.02 // the engine's own scheduling wait
			r.clock.Advance(secs(0.02 + s + 0.05))
			tr.Response(200, d)
			tr.PrefillEnd(nil, false)
			tr.Chunk(4)
			tr.End(nil)
		}
		smp = &metrics.Sample{TTFTMean: (queue + svc) / 3, TTFTCount: 3, HasTTFTMean: true,
			QueueTimeMean: queue / 3, QueueCount: 3, HasQueueTimeMean: true, UpdatedAt: r.clock.Now()}
		r.m.Prefill(p, Prompt{Tokens: 1})
	}
	for _, pr := range []Prompt{{Tokens: 2000}, {Tokens: 8000}} {
		if _, got := r.m.Prefill(p, pr); !near(got, trueService(pr, 1), 0.15) {
			t.Errorf("%d tokens: predicted %.4f, true %.4f", pr.Tokens, got, trueService(pr, 1))
		}
	}
}
