package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/traces"
)

// request is one request of the schedule: when it is sent (seconds from the run's start),
// its prompt and output lengths in tokens, its body (set by schedule), and its SLO bounds.
type request struct {
	at      float64
	prompt  int
	out     int
	body    []byte
	sloTTFT float64 // seconds
}

// traceRow is one line of an Azure trace.
type traceRow struct {
	at          float64 // Unix seconds
	prompt, out int
	src         string
}

const azureTime = "2006-01-02 15:04:05.9999999"

// readAzure reads TIMESTAMP,ContextTokens,GeneratedTokens from the traces' file system.
func readAzure(fsys fs.FS, name, src string) ([]traceRow, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	head, err := r.Read()
	if err != nil || len(head) != 3 || head[0] != "TIMESTAMP" {
		return nil, fmt.Errorf("%s: header %v (%v): want TIMESTAMP,ContextTokens,GeneratedTokens", name, head, err)
	}
	var rows []traceRow
	for line := 2; ; line++ {
		rec, err := r.Read()
		if err == io.EOF {
			return rows, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		t, err := time.Parse(azureTime, rec[0])
		in, err1 := strconv.Atoi(rec[1])
		gen, err2 := strconv.Atoi(rec[2])
		if err != nil || err1 != nil || err2 != nil || in < 1 {
			return nil, fmt.Errorf("%s:%d: %q: want a %s timestamp and positive token counts", name, line, rec, azureTime)
		}
		rows = append(rows, traceRow{at: float64(t.UnixNano()) / 1e9, prompt: in, out: max(1, gen), src: src})
	}
}

// readWorkload is a named workload's rows in arrival order: conv, code, or mix (both merged by
// arrival time).
func readWorkload(fsys fs.FS, name string) ([]traceRow, error) {
	var files []string
	switch name {
	case "conv":
		files = []string{traces.AzureConv}
	case "code":
		files = []string{traces.AzureCode}
	case "mix":
		files = []string{traces.AzureConv, traces.AzureCode}
	default:
		return nil, fmt.Errorf("-workload %q: valid workloads are conv, code, mix", name)
	}
	var all []traceRow
	for _, f := range files {
		src := "conv"
		if f == traces.AzureCode {
			src = "code"
		}
		rows, err := readAzure(fsys, f, src)
		if err != nil {
			return nil, err
		}
		all = append(all, rows...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at < all[j].at })
	return all, nil
}

// requestsOf is the requests every router is sent, without their instants and texts (schedule
// gives those): the first n rows of the workload whose
// prompt plus output fit maxLen, shuffled (seeded) so their mix of sizes is steady over the run,
// outputs cut to maxOut tokens when it is positive. It returns how many rows were passed over
// for not fitting.
func requestsOf(rows []traceRow, n, maxLen int, seed uint64, e engine, slo sloSpec, maxOut int) ([]request, int, error) {
	var kept []traceRow
	dropped := 0
	for _, r := range rows {
		if maxOut > 0 {
			r.out = min(r.out, maxOut)
		}
		if len(kept) == n {
			break
		}
		if r.prompt+r.out > maxLen {
			dropped++
			continue
		}
		kept = append(kept, r)
	}
	if len(kept) < n {
		return nil, 0, fmt.Errorf("the workload has %d requests that fit -max-model-len %d; asked for %d", len(kept), maxLen, n)
	}
	rng := rand.New(rand.NewPCG(seed, 0x11fe))
	rng.Shuffle(len(kept), func(a, b int) { kept[a], kept[b] = kept[b], kept[a] })
	out := make([]request, len(kept))
	for i, r := range kept {
		out[i] = request{prompt: r.prompt, out: r.out, sloTTFT: slo.ttftFor(e.idlePrefill(r.prompt))}
	}
	return out, dropped, nil
}

// schedule is the requests sent as a Poisson process of the given rate, its gaps drawn from
// seed, with prompt texts drawn from text: the same seeds give every router the same requests
// at the same instants. Each load and repetition takes a text seed of its own, so a router
// that remembers prompts (a prefix-cache index) never takes one run's prompts for another's
// cached prefix: the simulators cache nothing.
func schedule(reqs []request, rate float64, seed, text uint64) []request {
	out := slices.Clone(reqs)
	gaps := rand.New(rand.NewPCG(seed, 0xa771fa1))
	t := 0.0
	for i := range out {
		if i > 0 {
			t += gaps.ExpFloat64() / rate
		}
		out[i].at = t
		out[i].body = fmt.Appendf(nil, `{"model":%q,"prompt":%q,"max_tokens":%d,"ignore_eos":true,"stream":true}`,
			modelName, promptText(out[i].prompt, text, uint64(i)), out[i].out)
	}
	return out
}

// words are what prompts are made of: each is one token for the simulator's dummy tokenizer (a
// word) and for cl100k_base (the encoding Tandem counts with), with or without its leading
// space, so both sides count the trace's prompt length.
var words = strings.Fields("the of and to in is it for on with as at by be this that from or an are was but not have has had you they we he she his her all one can will more some time what when which there their would about out up so no if do my me our new just like get see two how now")

// promptText is exactly tokens words, drawn at random (seeded by the request): no two prompts
// share a prefix block, as the Azure traces record no sharing.
func promptText(tokens int, seed, idx uint64) string {
	r := rand.New(rand.NewPCG(seed, idx^0x5eed))
	var sb strings.Builder
	for i := range tokens {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(words[r.IntN(len(words))])
	}
	return sb.String()
}
