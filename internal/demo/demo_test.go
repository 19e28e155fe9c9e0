package demo

import (
	"bytes"
	"context"
	"flag"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/demo/workload"
	"github.com/tandem-epp/tandem/internal/extproc"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/pool/file"
	"github.com/tandem-epp/tandem/internal/serving"
	"github.com/tandem-epp/tandem/traces"
)

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
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, progress bytes.Buffer
	err := Run(ctx, Options{
		Traces: traces.Embedded(), Mix: workload.Mix{Conv: 12, Code: 4, Mooncake: 4, Window: 2 * time.Second, MaxPromptTokens: 8192, MaxOutputTokens: 16},
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

// runWithTandem runs the demo on mix (prompts up to 8192 tokens, 16 output tokens) with the real
// Tandem, ./cmd/epp built and run as a process, broken (a decode pod, "" none) broken from the
// start, and returns its report.
func runWithTandem(t *testing.T, mix workload.Mix, broken string) string {
	t.Helper()
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
	mix.MaxPromptTokens, mix.MaxOutputTokens = 8192, 16
	var out, progress bytes.Buffer
	err = Run(ctx, Options{
		Traces: traces.Embedded(), Mix: mix, TimeScale: 0.02, Listen: "127.0.0.1:0",
		RunEPP: ProcessEPP(bin, filepath.Join(tmp, "epp.log"), nil), Out: &out, Progress: &progress,
		BrokenDecode: broken,
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// TestRunWithTandem is `make demo` in small: it builds ./cmd/epp, runs it as a process with
// the generated endpoints file, and checks that long prompts went PD (a prefill leg fed the
// decode pod) and short ones to the standard pod, with nothing failing.
func TestRunWithTandem(t *testing.T) {
	s := runWithTandem(t, workload.Mix{Conv: 16, Code: 6, Mooncake: 6, Window: 3 * time.Second}, "")
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

func TestParseTransfers(t *testing.T) {
	text := `# TYPE tandem_pd_transfer_total counter
tandem_pd_transfer_total{decode_pod="default/decode-b",prefill_pod="default/prefill-b",result="recomputed"} 2
tandem_pd_transfer_total{decode_pod="default/decode-a",prefill_pod="default/prefill-a",result="verified"} 40
tandem_decisions_total{outcome="pd",step="pair",strategy="pd"} 42
`
	got, err := parseTransfers(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []Transfer{{"prefill-b", "decode-b", "recomputed", 2}, {"prefill-a", "decode-a", "verified", 40}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// TestDemoCatchesBrokenPair is the demo's broken pair in small, with the real Tandem (./cmd/epp
// as a process). decode-b's KV connector is broken from the start: the picker spreads the first
// requests over both pairs, whereas later it may send a pod it has seen slow no work for a
// while, so a short replay need not reach a pod broken partway. The report shows, from
// Tandem's /metrics and decision traces, the broken pair's recomputed transfers counted (no
// more than the pod's own account), decode-b caught and held out of PD work (its last request
// within 5 s of its catching), and the healthy pair with 0 recomputed; every request succeeds.
func TestDemoCatchesBrokenPair(t *testing.T) {
	s := runWithTandem(t, workload.Mix{Conv: 40, Code: 12, Mooncake: 12, Window: 10 * time.Second}, "decode-b")
	t.Log(s)
	if !strings.Contains(s, "64 requests replayed") || !strings.Contains(s, ", 0 failed.") {
		t.Fatalf("want 64 requests and no failure")
	}
	// The healthy pair: verified transfers, none recomputed.
	if m := regexp.MustCompile(`prefill-a → decode-a +verified +(\d+) +recomputed +(\d+)`).FindStringSubmatch(s); m == nil || m[1] == "0" || m[2] != "0" {
		t.Errorf("the healthy pair's verdicts: %v, want some verified and 0 recomputed", m)
	}
	// The broken pair: recomputed transfers counted by Tandem (2 hold the pod), no more than
	// decode-b really recomputed (a prompt its own prefix cache held may be judged unknown).
	m := regexp.MustCompile(`prefill-b → decode-b +verified +\d+ +recomputed +(\d+)`).FindStringSubmatch(s)
	if m == nil {
		t.Fatal("no transfer counted on the broken pair")
	}
	own := regexp.MustCompile(`decode-b used the transferred KV \d+×, recomputed the prompt (\d+)×`).FindStringSubmatch(s)
	if own == nil {
		t.Fatal("no account of decode-b's own")
	}
	counted, _ := strconv.Atoi(m[1])
	recomputed, _ := strconv.Atoi(own[1])
	if counted < 2 || counted > recomputed {
		t.Errorf("Tandem counted %d recomputed transfers on decode-b, which recomputed %d prompts: want 2 or more, and no more than it did", counted, recomputed)
	}
	if !strings.Contains(s, "Broken pair: decode-b's KV connector was broken from the start") {
		t.Fatal("the report does not name the broken pair")
	}
	if !regexp.MustCompile(`Caught: held out of PD work from [\d.]+s .*\n.*\n.*pd_transfer_held is in the decision trace of [1-9]`).MatchString(s) {
		t.Fatal("the broken pair was not caught, or not held out of PD work")
	}
	// Once caught, it stops receiving PD work within 5 s.
	if m := regexp.MustCompile(`its last request was sent at [\d.]+s, (\S+) after it was caught`).FindStringSubmatch(s); m != nil {
		if d, err := time.ParseDuration(strings.Replace(m[1], "—", "0s", 1)); err != nil || d > 5*time.Second {
			t.Errorf("decode-b still received PD work %s after it was caught (%v), want within 5 s", m[1], err)
		}
	} else if !regexp.MustCompile(`its last request was sent at [\d.]+s, before it was caught`).MatchString(s) {
		t.Error("the report does not say when decode-b received its last request")
	}
	if !strings.Contains(s, "decode-b's share of the decode pods' requests:") || !strings.Contains(s, "once held") {
		t.Error("no share of decode work before and after")
	}
}
