// Package workload turns the demo's slice of real traces into the requests it replays: which
// rows of each trace, their arrival times fitted into the demo's window, and prompt text whose
// shared prefixes follow the trace's. It reads the traces from an fs.FS (the embedded ones, or
// a --data directory) and imports nothing heavy, so cmd/demo can check its inputs in a second,
// before it builds anything. It must not start servers or send requests.
package workload

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-epp/tandem/traces"
)

// BytesPerToken is how prompt text is sized from a token count (the simulator's tokenizer
// and Tandem's estimate both count about four bytes a token).
const BytesPerToken = 4

// mooncakeBlockTokens is the Mooncake trace's prefix block: one hash id per 512 tokens.
const mooncakeBlockTokens = 512

// Request is one replayed request.
type Request struct {
	Source       string        // trace it came from
	At           time.Duration // offset from the start of the run
	PromptTokens int
	OutputTokens int
	Prompt       string
}

// Mix says how many requests to take from each trace and how to scale them.
type Mix struct {
	Conv, Code, Mooncake int
	// Window is the span the arrivals are compressed (or stretched) into.
	Window time.Duration
	// MaxPromptTokens and MaxOutputTokens cap each request so the run stays short.
	MaxPromptTokens, MaxOutputTokens int
}

// Files returns the trace files the mix reads (those it takes requests from).
func (m Mix) Files() []string {
	var out []string
	for _, f := range []struct {
		name string
		n    int
	}{{traces.AzureConv, m.Conv}, {traces.AzureCode, m.Code}, {traces.Mooncake, m.Mooncake}} {
		if f.n > 0 {
			out = append(out, f.name)
		}
	}
	return out
}

// Load reads the traces the mix needs from fsys (traces.Open) and merges them into one schedule.
func Load(fsys fs.FS, m Mix) ([]Request, error) {
	var all []Request
	for _, src := range []struct {
		name string
		n    int
		load func(io.Reader, int, Mix) ([]Request, error)
	}{
		{traces.AzureConv, m.Conv, readAzure}, {traces.AzureCode, m.Code, readAzure}, {traces.Mooncake, m.Mooncake, readMooncake},
	} {
		if src.n <= 0 {
			continue
		}
		f, err := fsys.Open(src.name)
		if err != nil {
			return nil, fmt.Errorf("workload: %w (set --data to a directory holding %s, or leave it unset for the traces in the repository)", err, src.name)
		}
		reqs, err := src.load(f, src.n, m)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("workload: %s: %w", src.name, err)
		}
		name := strings.TrimSuffix(strings.TrimSuffix(src.name, ".csv"), ".jsonl")
		for i := range reqs {
			reqs[i].Source = name
		}
		all = append(all, fit(reqs, m.Window)...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].At < all[j].At })
	return all, nil
}

// fit rescales arrival offsets so the first is 0 and the last at window.
func fit(reqs []Request, window time.Duration) []Request {
	if len(reqs) == 0 {
		return reqs
	}
	first, last := reqs[0].At, reqs[len(reqs)-1].At
	span := last - first
	for i := range reqs {
		if span <= 0 {
			reqs[i].At = 0
			continue
		}
		reqs[i].At = time.Duration(float64(reqs[i].At-first) / float64(span) * float64(window))
	}
	return reqs
}

func capTokens(n, max int) int {
	if n < 1 {
		n = 1
	}
	if max > 0 && n > max {
		return max
	}
	return n
}

// readAzure reads the first n rows of an Azure LLM trace (TIMESTAMP,ContextTokens,GeneratedTokens).
// Every prompt is unique text: these traces carry no prefix information.
func readAzure(r io.Reader, n int, m Mix) ([]Request, error) {
	cr := csv.NewReader(bufio.NewReader(r))
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	if strings.Join(head, ",") != "TIMESTAMP,ContextTokens,GeneratedTokens" {
		return nil, fmt.Errorf("header is %q, want TIMESTAMP,ContextTokens,GeneratedTokens", strings.Join(head, ","))
	}
	var out []Request
	var t0 time.Time
	for line := 2; len(out) < n; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		ts, err := time.Parse("2006-01-02 15:04:05.9999999", rec[0])
		if err != nil {
			return nil, fmt.Errorf("line %d: TIMESTAMP %q: %w", line, rec[0], err)
		}
		ctx, err1 := strconv.Atoi(rec[1])
		gen, err2 := strconv.Atoi(rec[2])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("line %d: ContextTokens %q and GeneratedTokens %q must be integers", line, rec[1], rec[2])
		}
		if t0.IsZero() {
			t0 = ts
		}
		p := capTokens(ctx, m.MaxPromptTokens)
		out = append(out, Request{At: ts.Sub(t0), PromptTokens: p, OutputTokens: capTokens(gen, m.MaxOutputTokens),
			Prompt: uniqueText(fmt.Sprintf("req-%d", line), p)})
	}
	return out, nil
}

type mooncakeLine struct {
	Timestamp    int64   `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// readMooncake takes the first n requests whose first prefix block recurs in the trace (the
// multi-turn conversations and shared system prompts), so the slice shows prefix reuse. Each
// hash id becomes the same 512-token block of text wherever it appears.
func readMooncake(r io.Reader, n int, m Mix) ([]Request, error) {
	var lines []mooncakeLine
	firstBlock := map[int64]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for no := 1; sc.Scan(); no++ {
		var l mooncakeLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("line %d: %w", no, err)
		}
		if len(l.HashIDs) > 0 {
			firstBlock[l.HashIDs[0]]++
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []Request
	for _, l := range lines {
		if len(out) == n {
			break
		}
		if len(l.HashIDs) == 0 || firstBlock[l.HashIDs[0]] < 2 {
			continue
		}
		p := capTokens(l.InputLength, m.MaxPromptTokens)
		out = append(out, Request{At: time.Duration(l.Timestamp) * time.Millisecond, PromptTokens: p,
			OutputTokens: capTokens(l.OutputLength, m.MaxOutputTokens), Prompt: blockText(l.HashIDs, p)})
	}
	return out, nil
}

// blockText builds tokens×4 bytes of text from prefix blocks: equal ids give equal text, so
// requests sharing a prefix of ids share a prefix of text.
func blockText(ids []int64, tokens int) string {
	var b strings.Builder
	want := tokens * BytesPerToken
	b.Grow(want)
	for _, id := range ids {
		if b.Len() >= want {
			break
		}
		writeFiller(&b, fmt.Sprintf("block-%d", id), mooncakeBlockTokens*BytesPerToken)
	}
	if b.Len() < want { // more tokens than blocks: pad with text unique to the request's last block
		writeFiller(&b, fmt.Sprintf("tail-%d-%d", len(ids), tokens), want-b.Len())
	}
	return b.String()[:want]
}

// uniqueText is tokens×4 bytes of text that starts with seed, so no two requests share a prefix.
func uniqueText(seed string, tokens int) string {
	var b strings.Builder
	writeFiller(&b, seed, tokens*BytesPerToken)
	return b.String()[:tokens*BytesPerToken]
}

// writeFiller appends n bytes of word-like text derived from seed (deterministic).
func writeFiller(b *strings.Builder, seed string, n int) {
	start := b.Len()
	h := uint32(2166136261)
	for i := 0; i < len(seed); i++ {
		h = (h ^ uint32(seed[i])) * 16777619
	}
	b.WriteString(seed)
	b.WriteByte(' ')
	for b.Len()-start < n {
		h ^= h << 13
		h ^= h >> 17
		h ^= h << 5
		fmt.Fprintf(b, "w%03d ", h%1000)
	}
	// Trim the overshoot so blocks have exact sizes.
	s := b.String()[:start+n]
	b.Reset()
	b.WriteString(s)
}
