package main

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/internal/sim"
)

// modelName is the model every simulated pod serves and every request names.
const modelName = "sim-model"

// mooncakeBlockTokens is the Mooncake trace's hash_ids block size.
const mooncakeBlockTokens = 512

// traceReq is one line of a trace: arrival (seconds from the trace's first request), prompt
// and output tokens, and for Mooncake the prefix-block hash ids.
type traceReq struct {
	at      float64
	prompt  int
	out     int
	hashIDs []int
	src     string // "conv", "code", "mooncake"
}

// wreq is a request ready to replay: its JSON body (the prompt text built so the trace's
// sharing becomes real shared prefixes) and the engine-side block hashes of that text.
type wreq struct {
	id     int
	at     float64 // trace seconds from the window's first arrival (the trace's own timing)
	prompt int
	out    int
	body   []byte
	hashes []uint64 // sim.BlockHashes(sim.Tokenize(prompt text)), what the engine caches
	ids    []int    // the trace's hash_ids (Mooncake), for tests
	// the request's SLO bounds (sloSpec.of)
	sloTTFT, sloTPOT float64
}

// workload is a window of one trace.
type workload struct {
	name    string
	source  string
	window  int // which window of the trace (0, 1, …): repetition k replays window k
	reqs    []wreq
	span    float64 // seconds between the first and last arrival in the trace window
	dropped int     // requests whose prompt+output exceed one pod's KV capacity
	// shuffled: the window's order was shuffled, so its mix of sizes is the same all along
	// (Azure: no prefix sharing to keep); Mooncake keeps its order (multi-turn sharing)
	shuffled bool
}

// arrivals is when each request arrives: a Poisson process of the given rate (steady load;
// its gaps drawn from seed), or the trace's own times for rate 0.
func (w *workload) arrivals(rate float64, seed uint64) []float64 {
	out := make([]float64, len(w.reqs))
	if rate <= 0 {
		for i, q := range w.reqs {
			out[i] = q.at
		}
		return out
	}
	r := rand.New(rand.NewPCG(seed, 0xa771fa1))
	t := 0.0
	for i := range out {
		if i > 0 {
			t += r.ExpFloat64() / rate
		}
		out[i] = t
	}
	return out
}

// findData resolves the traces shipped in the repository (traces/, found by walking up to
// go.mod from the working directory), so no machine path is written down.
func findData(flagDir string) (string, error) {
	if flagDir != "" {
		return flagDir, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			data := filepath.Join(d, "traces")
			if _, err := os.Stat(data); err != nil {
				return "", fmt.Errorf("trace directory %s: %w; pass -data DIR", data, err)
			}
			return data, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s; run from the repository or pass -data DIR", dir)
		}
	}
}

const azureTime = "2006-01-02 15:04:05.9999999"

// readAzure reads TIMESTAMP,ContextTokens,GeneratedTokens; at is absolute Unix seconds.
func readAzure(path, src string) ([]traceReq, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(bufio.NewReader(f))
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: header: %w", path, err)
	}
	if len(head) != 3 || head[0] != "TIMESTAMP" {
		return nil, fmt.Errorf("%s: header %v: want TIMESTAMP,ContextTokens,GeneratedTokens", path, head)
	}
	var out []traceReq
	for line := 2; ; line++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		t, err := time.Parse(azureTime, rec[0])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: TIMESTAMP %q: %w", path, line, rec[0], err)
		}
		in, err1 := strconv.Atoi(rec[1])
		gen, err2 := strconv.Atoi(rec[2])
		if err1 != nil || err2 != nil || in < 1 {
			return nil, fmt.Errorf("%s:%d: ContextTokens/GeneratedTokens %q,%q: want positive integers", path, line, rec[1], rec[2])
		}
		out = append(out, traceReq{at: float64(t.UnixNano()) / 1e9, prompt: in, out: max(1, gen), src: src})
	}
	return out, nil
}

// readMooncake reads {"timestamp" ms, "input_length", "output_length", "hash_ids"}.
func readMooncake(path string) ([]traceReq, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var out []traceReq
	for line := 1; sc.Scan(); line++ {
		var x struct {
			Timestamp float64 `json:"timestamp"`
			In        int     `json:"input_length"`
			Out       int     `json:"output_length"`
			HashIDs   []int   `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &x); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if x.In < 1 || len(x.HashIDs)*mooncakeBlockTokens < x.In {
			return nil, fmt.Errorf("%s:%d: input_length %d with %d hash_ids of %d tokens: inconsistent", path, line, x.In, len(x.HashIDs), mooncakeBlockTokens)
		}
		out = append(out, traceReq{at: x.Timestamp / 1000, prompt: x.In, out: max(1, x.Out), hashIDs: x.HashIDs, src: "mooncake"})
	}
	return out, sc.Err()
}

// trace is a whole trace (or the merged Azure traces), sorted by arrival.
type trace struct {
	name, source string
	reqs         []traceReq
}

// readTrace reads a named workload's trace.
func readTrace(dataDir, name string) (*trace, error) {
	var all []traceReq
	var source string
	switch name {
	case "conv":
		source = "azure-llm-2023-conv.csv"
		xs, err := readAzure(filepath.Join(dataDir, source), "conv")
		if err != nil {
			return nil, err
		}
		all = xs
	case "code":
		source = "azure-llm-2023-code.csv"
		xs, err := readAzure(filepath.Join(dataDir, source), "code")
		if err != nil {
			return nil, err
		}
		all = xs
	case "mix":
		source = "azure-llm-2023-conv.csv + azure-llm-2023-code.csv, merged by timestamp"
		a, err := readAzure(filepath.Join(dataDir, "azure-llm-2023-conv.csv"), "conv")
		if err != nil {
			return nil, err
		}
		b, err := readAzure(filepath.Join(dataDir, "azure-llm-2023-code.csv"), "code")
		if err != nil {
			return nil, err
		}
		all = append(a, b...)
	case "mooncake":
		source = "mooncake-synthetic.jsonl"
		xs, err := readMooncake(filepath.Join(dataDir, source))
		if err != nil {
			return nil, err
		}
		all = xs
	default:
		return nil, fmt.Errorf("-workloads: unknown workload %q; valid: conv, code, mix, mooncake", name)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at < all[j].at })
	return &trace{name: name, source: source, reqs: all}, nil
}

// loadWorkload reads a named workload and keeps its first window of n requests.
func loadWorkload(dataDir, name string, n int, p sim.Params, seed uint64) (*workload, error) {
	tr, err := readTrace(dataDir, name)
	if err != nil {
		return nil, err
	}
	return tr.window(n, 0, p, seed, defaultSLO)
}

// window is the k-th window of n consecutive requests (in arrival order, wrapping around the
// trace's end) whose prompt plus output fit one pod's KV capacity. A contiguous window keeps,
// for Mooncake, its multi-turn order and prefix sharing; an Azure window (no sharing recorded)
// is shuffled, seeded, so its mix of prompt sizes is steady over the run instead of following
// the trace's bursts (the 2000-request mix window carries half its prefill work in its last fifth).
func (tr *trace) window(n, k int, p sim.Params, seed uint64, slo sloSpec) (*workload, error) {
	w := &workload{name: tr.name, source: tr.source, window: k, shuffled: tr.name != "mooncake"}
	var fit []int // indexes of the requests that fit
	for i, r := range tr.reqs {
		if r.prompt+r.out > p.KVTokens {
			w.dropped++
			continue
		}
		fit = append(fit, i)
	}
	if len(fit) < 2 {
		return nil, fmt.Errorf("workload %s: %d usable requests; need at least 2", tr.name, len(fit))
	}
	n = min(n, len(fit))
	var kept []int
	for j := 0; j < n; j++ {
		kept = append(kept, fit[(k*n+j)%len(fit)])
	}
	if w.shuffled {
		r := rand.New(rand.NewPCG(seed, uint64(k)+0x5b0ff1e))
		r.Shuffle(len(kept), func(a, b int) { kept[a], kept[b] = kept[b], kept[a] })
	}
	t0 := tr.reqs[kept[0]].at
	blocks := map[int]string{}
	for i, idx := range kept {
		r := tr.reqs[idx]
		var text string
		if r.hashIDs != nil {
			text = mooncakeText(r, blocks, seed)
		} else {
			text = uniqueText(r.prompt, seed, uint64(idx)+1, r.src)
		}
		body := fmt.Appendf(nil, `{"model":%q,"prompt":"%s","max_tokens":%d,"stream":true}`, modelName, text, r.out)
		at := r.at - t0
		if w.shuffled || at < 0 {
			at = 0 // a shuffled window has no trace timing; it is always replayed at a rate
		}
		q := wreq{id: i, at: at, prompt: r.prompt, out: r.out, body: body,
			hashes: sim.BlockHashes(sim.Tokenize(text), p.BlockSize), ids: r.hashIDs}
		q.sloTTFT, q.sloTPOT = slo.of(p, r.prompt)
		w.reqs = append(w.reqs, q)
	}
	if !w.shuffled {
		w.span = w.reqs[len(w.reqs)-1].at
	} else {
		// the trace rate of a shuffled window: its requests over the time they spanned
		lo, hi := tr.reqs[kept[0]].at, tr.reqs[kept[0]].at
		for _, idx := range kept {
			lo, hi = min(lo, tr.reqs[idx].at), max(hi, tr.reqs[idx].at)
		}
		w.span = hi - lo
	}
	if w.span <= 0 {
		return nil, fmt.Errorf("workload %s: all %d arrivals at one instant; cannot scale a rate", tr.name, len(w.reqs))
	}
	return w, nil
}

// vocabulary of the generated prompt text: lower-case words, JSON-safe.
var vocab = strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu " +
	"gpu cache token model batch queue prefill decode kernel tensor layer head weight matrix vector shard route pool node")

// fillText writes exactly n bytes of words drawn from r.
func fillText(sb *strings.Builder, n int, r *rand.Rand) {
	start := sb.Len()
	for sb.Len()-start < n {
		w := vocab[r.IntN(len(vocab))]
		left := n - (sb.Len() - start)
		if len(w)+1 > left {
			sb.WriteString("zzzzzzzzzzzzzzzz"[:min(left, 16)])
			for sb.Len()-start < n {
				sb.WriteByte('z')
			}
			break
		}
		sb.WriteString(w)
		sb.WriteByte(' ')
	}
}

// uniqueText is a prompt of the given tokens shared with no other request: the Azure traces
// record no prefix sharing, so none is invented.
func uniqueText(tokens int, seed, idx uint64, src string) string {
	var sb strings.Builder
	n := tokens * sim.BytesPerToken
	sb.Grow(n + 32)
	tag := fmt.Sprintf("%s-%d-%d ", src, seed, idx) // makes the first block unique
	sb.WriteString(tag)
	fillText(&sb, n-len(tag), rand.New(rand.NewPCG(seed, idx^0x5eed)))
	return sb.String()[:n]
}

// mooncakeText concatenates one fixed text per hash id (mooncakeBlockTokens tokens each),
// cut to the prompt length: requests sharing leading hash ids share a real text prefix.
func mooncakeText(r traceReq, blocks map[int]string, seed uint64) string {
	var sb strings.Builder
	n := r.prompt * sim.BytesPerToken
	sb.Grow(len(r.hashIDs) * mooncakeBlockTokens * sim.BytesPerToken)
	for _, h := range r.hashIDs {
		b, ok := blocks[h]
		if !ok {
			var bb strings.Builder
			tag := fmt.Sprintf("block-%d ", h)
			bb.WriteString(tag)
			fillText(&bb, mooncakeBlockTokens*sim.BytesPerToken-len(tag), rand.New(rand.NewPCG(seed, uint64(h)+1<<40)))
			b = bb.String()
			blocks[h] = b
		}
		sb.WriteString(b)
		if sb.Len() >= n {
			break
		}
	}
	return sb.String()[:n]
}
