package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/sim"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pods.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// start runs the command in-process and returns the pods it announced.
func start(t *testing.T, ctx context.Context, args []string, n int) ([]podLine, <-chan error) {
	t.Helper()
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := run(ctx, args, pw, io.Discard)
		pw.CloseWithError(io.EOF)
		errc <- err
	}()
	sc := bufio.NewScanner(pr)
	var pods []podLine
	for len(pods) < n && sc.Scan() {
		var p podLine
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		pods = append(pods, p)
	}
	if len(pods) != n {
		t.Fatalf("got %d pod lines, want %d (run: %v)", len(pods), n, <-errc)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	return pods, errc
}

func TestRunPodsFromYAML(t *testing.T) {
	cfg := writeConfig(t, `
pods:
- name: p0
  engine: vllm
  role: prefill
  time_scale: 0.001
- name: d0
  engine: vllm
  role: decode
  routing_sidecar: true
  time_scale: 0.001
  params: {max_running: 4}
- name: s0
  engine: trtllm
  model: other
`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, errc := start(t, ctx, []string{"-config", cfg}, 3)
	if pods[0].Name != "p0" || pods[1].Role != "decode" || pods[2].MetricsPath != "/prometheus/metrics" || pods[2].Model != "other" {
		t.Fatalf("pods %+v", pods)
	}
	for _, p := range pods {
		if !strings.HasPrefix(p.HostPort, "127.0.0.1:") || !strings.HasPrefix(p.KVHostPort, "127.0.0.1:") {
			t.Fatalf("pod %s not on loopback: %+v", p.Name, p)
		}
	}
	// The decode pod runs the prefill leg itself through the sidecar protocol.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, pods[1].URL+"/v1/completions", strings.NewReader(`{"model":"sim-model","prompt":"hi","max_tokens":2}`))
	req.Header.Set("x-prefiller-host-port", pods[0].HostPort)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("sidecar request: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
}

func TestRunFlagsAndCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, errc := start(t, ctx, []string{"-engine", "sglang", "-role", "decode", "-addr", "127.0.0.1:0", "-max-running", "2"}, 1)
	if pods[0].Engine != "sglang" || pods[0].Role != "decode" {
		t.Fatalf("pod %+v", pods[0])
	}
	resp, err := http.Post(pods[0].URL+"/sim/crash", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := <-errc; !errors.Is(err, errCrashed) {
		t.Fatalf("run after a crash: %v, want errCrashed", err)
	}
}

// -profile picks the parameters the other model flags start from.
func TestRunProfile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, _ := start(t, ctx, []string{"-profile", "llama8b-h100", "-addr", "127.0.0.1:0"}, 1)
	resp, err := http.Get(pods[0].URL + "/sim/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st sim.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if want := sim.Llama8BH100().KVTokens; st.KVTokens != want {
		t.Fatalf("kv_tokens %d with -profile llama8b-h100, want the profile's %d", st.KVTokens, want)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-engine", "tgi", "-addr", "127.0.0.1:0"}, "engine"},
		{[]string{"-config", writeConfig(t, "pods:\n- engine: vllm\n  modle: x\n")}, `pods[0]: json: unknown field "modle"`},
		{[]string{"-config", writeConfig(t, "pods: []\n")}, "pods is empty"},
		{[]string{"-config", writeConfig(t, "pods:\n- engine: vllm\n  params: {block_size: 0}\n")}, "block_size"},
		{[]string{"stray"}, "unexpected arguments"},
		{[]string{"-profile", "h100"}, "-profile"},
	} {
		err := run(context.Background(), c.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}

// -kv-format and -kv-load-failure-policy: a sidecar decode pod of another revision cannot load
// the prefill pod's KV; with recompute it answers 200 anyway, with fail a 400 naming the format.
func TestRunKVFormatFlags(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	common := []string{"-addr", "127.0.0.1:0", "-time-scale", "0.001"}
	pre, _ := start(t, ctx, append([]string{"-role", "prefill", "-kv-format", "a"}, common...), 1)
	for _, c := range []struct {
		policy string
		status int
	}{{"recompute", 200}, {"fail", 400}} {
		dec, _ := start(t, ctx, append([]string{"-role", "decode", "-routing-sidecar", "-kv-format", "b", "-kv-load-failure-policy", c.policy}, common...), 1)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, dec[0].URL+"/v1/completions", strings.NewReader(`{"model":"sim-model","prompt":"hi","max_tokens":2}`))
		req.Header.Set("x-prefiller-host-port", pre[0].HostPort)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || (c.status == 400 && !strings.Contains(string(body), sim.FieldKVFormat)) {
			t.Fatalf("policy %s: %d %s, want %d", c.policy, resp.StatusCode, body, c.status)
		}
	}
}
