package demo

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/pool/file"
	"github.com/tandem-epp/tandem/internal/serving"
)

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadWorkload(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, ConvFile, "TIMESTAMP,ContextTokens,GeneratedTokens\n"+
		"2023-11-16 18:15:46.0000000,100,10\n"+
		"2023-11-16 18:15:47.0000000,5000,400\n"+
		"2023-11-16 18:15:50.0000000,300,5\n")
	writeFile(t, dir, CodeFile, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,700,8\n")
	writeFile(t, dir, MooncakeFile, ""+
		`{"timestamp": 0, "input_length": 1200, "output_length": 3, "hash_ids": [1, 2, 3]}`+"\n"+
		`{"timestamp": 10, "input_length": 50, "output_length": 3, "hash_ids": [7]}`+"\n"+
		`{"timestamp": 40, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 9]}`+"\n")

	reqs, err := LoadWorkload(dir, Mix{Conv: 3, Code: 1, Mooncake: 5, Window: 10 * time.Second, MaxPromptTokens: 4096, MaxOutputTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		src            string
		at             time.Duration
		prompt, output int
	}
	var got []row
	for _, r := range reqs {
		got = append(got, row{r.Source, r.At, r.PromptTokens, r.OutputTokens})
		if len(r.Prompt) != r.PromptTokens*bytesPerToken {
			t.Errorf("%s: prompt of %d bytes for %d tokens, want 4 bytes a token", r.Source, len(r.Prompt), r.PromptTokens)
		}
	}
	// Each trace spans the window: conv arrivals 0s, 1s, 4s of 4s → 0, 2.5s, 10s; the lone
	// code request sits at 0; Mooncake keeps only the two requests sharing block 1 (0, 40ms).
	want := []row{
		{"azure-llm-2023-conv", 0, 100, 10}, {"azure-llm-2023-code", 0, 700, 8}, {"mooncake-synthetic", 0, 1200, 3},
		{"azure-llm-2023-conv", 2500 * time.Millisecond, 4096, 256},
		{"azure-llm-2023-conv", 10 * time.Second, 300, 5}, {"mooncake-synthetic", 10 * time.Second, 1100, 3},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d requests %v, want %v", len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// Mooncake requests share exactly their common blocks (1, 2): 2 × 512 tokens × 4 bytes.
	a, b := reqs[2].Prompt, reqs[5].Prompt
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	if lo := 2 * mooncakeBlockTokens * bytesPerToken; common < lo || common > lo+16 {
		t.Errorf("shared prefix %d bytes, want about %d (blocks 1 and 2)", common, lo)
	}
	if strings.HasPrefix(reqs[0].Prompt[:64], reqs[4].Prompt[:64]) {
		t.Errorf("Azure prompts share a prefix; they must be unique")
	}
}

func TestLoadWorkloadErrors(t *testing.T) {
	cases := []struct{ name, file, content, want string }{
		{"bad header", ConvFile, "time,a,b\n", "want TIMESTAMP,ContextTokens,GeneratedTokens"},
		{"bad number", ConvFile, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,x,1\n", "line 2: ContextTokens"},
		{"bad json", MooncakeFile, "{nope\n", "line 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, c.file, c.content)
			m := Mix{Window: time.Second}
			if c.file == ConvFile {
				m.Conv = 1
			} else {
				m.Mooncake = 1
			}
			_, err := LoadWorkload(dir, m)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
	if _, err := LoadWorkload(t.TempDir(), Mix{Code: 1}); err == nil || !strings.Contains(err.Error(), "--data") {
		t.Errorf("missing file: err = %v, want a hint about --data", err)
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	cases := []struct {
		in   []time.Duration
		q    float64
		want time.Duration
	}{
		{nil, .5, 0},
		{ms(7), .99, 7 * time.Millisecond},
		{ms(4, 1, 3, 2), .5, 2 * time.Millisecond},  // nearest rank: ceil(0.5·4) = 2nd
		{ms(4, 1, 3, 2), .99, 4 * time.Millisecond}, // ceil(0.99·4) = 4th
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), .9, 9 * time.Millisecond},
	}
	for _, c := range cases {
		if got := percentile(c.in, c.q); got != c.want {
			t.Errorf("percentile(%v, %v) = %v, want %v", c.in, c.q, got, c.want)
		}
	}
}

func TestParseDecisions(t *testing.T) {
	text := `# HELP tandem_picker_decisions_total Scheduling decisions
# TYPE tandem_picker_decisions_total counter
tandem_picker_decisions_total{outcome="pd",step="prefix_cache",strategy="pd"} 12
tandem_decisions_total{outcome="combined",step="bucket",strategy="pd"} 3
other_metric{outcome="pd"} 99
`
	got, err := parseDecisions(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []Decision{{"pd", "pd", "prefix_cache", 12}, {"pd", "combined", "bucket", 3}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// standInEPP runs an EPP from the parts in the tree (file pool source, ext_proc server,
// gRPC serving with TLS and health) with the same flags the demo gives Tandem, so the demo's
// own machinery is tested without internal/app. It has no PD strategy (ext_proc's default
// least-request), so like any non-PD EPP it is given the pool without its prefill pods.
func standInEPP(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("stand-in", flag.ContinueOnError)
	endpoints := fs.String("endpoints-file", "", "")
	host := fs.String("bind-address", "", "")
	grpcPort := fs.Int("grpc-port", 0, "")
	healthPort := fs.Int("grpc-health-port", 0, "")
	fs.Int("metrics-port", 0, "")
	fs.Bool("debug-trace-header", false, "")
	fs.String("zap-log-level", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	info, eps, err := file.Load(*endpoints)
	if err != nil {
		return err
	}
	var routable []*pool.Endpoint
	for _, e := range eps {
		if e.Role != pool.RolePrefill {
			routable = append(routable, e)
		}
	}
	store := pool.NewStore()
	store.Publish(info, routable, true)
	srv, err := serving.New(serving.Config{Host: *host, GRPCPort: *grpcPort, HealthPort: *healthPort, SecureServing: true, GracePeriod: time.Second},
		extproc.NewServer(store, nil, extproc.Options{}), store)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// TestRunEndToEnd runs the whole demo (real simulated pods, real gRPC, real gateway, a slice
// of the real traces) against the stand-in EPP.
func TestRunEndToEnd(t *testing.T) {
	dir, err := FindDataDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, progress bytes.Buffer
	err = Run(ctx, Options{
		DataDir: dir, Mix: Mix{Conv: 12, Code: 4, Mooncake: 4, Window: 2 * time.Second, MaxPromptTokens: 8192, MaxOutputTokens: 16},
		TimeScale: 0.01, Listen: "127.0.0.1:0", RunEPP: standInEPP, Out: &out, Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "20 requests replayed") || !strings.Contains(s, ", 0 failed.") {
		t.Fatalf("summary does not report 20 requests without failures:\n%s\nprogress:\n%s", s, progress.String())
	}
	// Every replayed request reached a pod: the per-pod counts add up to 20 (no PD strategy
	// in the stand-in, so no prefill legs and no PD request).
	total := 0
	for _, m := range regexp.MustCompile(`(?m)^  \S+ +\S+ +roleset \S+ +127\.0\.0\.1:\d+  (\d+)$`).FindAllStringSubmatch(s, -1) {
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	if total != 20 {
		t.Errorf("pods received %d requests in total, want 20:\n%s", total, s)
	}
	if !strings.Contains(s, "Routing: 0 went PD") || !strings.Contains(s, "prefill (legs)") {
		t.Errorf("summary misreports PD routing:\n%s", s)
	}
	t.Log(s)
	if !strings.Contains(progress.String(), "sent 20/20") {
		t.Errorf("progress line never showed the end: %q", progress.String())
	}
}

// TestRunWithTandem is `make demo` in small: it builds ./cmd/epp, runs it as a process with
// the generated endpoints file, and checks that long prompts went PD (a prefill leg fed the
// decode pod) and short ones to the standard pod, with nothing failing.
func TestRunWithTandem(t *testing.T) {
	dataDir, err := FindDataDir()
	if err != nil {
		t.Fatal(err)
	}
	root, err := FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	bin, err := BuildEPP(ctx, root, tmp)
	if err != nil {
		t.Fatal(err)
	}
	var out, progress bytes.Buffer
	err = Run(ctx, Options{
		DataDir: dataDir, Mix: Mix{Conv: 16, Code: 6, Mooncake: 6, Window: 3 * time.Second, MaxPromptTokens: 8192, MaxOutputTokens: 16},
		TimeScale: 0.02, Listen: "127.0.0.1:0", RunEPP: ProcessEPP(bin, filepath.Join(tmp, "epp.log"), nil), Out: &out, Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	t.Log(s)
	if !strings.Contains(s, "28 requests replayed") || !strings.Contains(s, ", 0 failed.") {
		t.Fatalf("want 28 requests and no failure")
	}
	m := regexp.MustCompile(`Routing: (\d+) went PD .*, (\d+) combined .*, (\d+) to a decode pod`).FindStringSubmatch(s)
	if m == nil {
		t.Fatal("no routing line")
	}
	pd, _ := strconv.Atoi(m[1])
	combined, _ := strconv.Atoi(m[2])
	if pd == 0 || combined == 0 || m[3] != "0" || pd+combined != 28 {
		t.Errorf("PD %d, combined %d, decode-only %s: want both paths used and nothing else", pd, combined, m[3])
	}
	if !strings.Contains(s, "tandem_decisions_total") || strings.Contains(s, "metrics not readable") {
		t.Errorf("the why-section did not come from Tandem's metrics")
	}
}
