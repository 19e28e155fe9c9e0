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

// TestRunWithTandem is `make demo` in small: it builds ./cmd/epp, runs it as a process with
// the generated endpoints file, and checks that long prompts went PD (a prefill leg fed the
// decode pod) and short ones to the standard pod, with nothing failing.
func TestRunWithTandem(t *testing.T) {
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
		Traces: traces.Embedded(), Mix: workload.Mix{Conv: 16, Code: 6, Mooncake: 6, Window: 3 * time.Second, MaxPromptTokens: 8192, MaxOutputTokens: 16},
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
