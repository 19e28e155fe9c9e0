package outliere2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/tandem-epp/tandem/internal/app"
	"github.com/tandem-epp/tandem/internal/app/apptest"
	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/testenv"
)

const (
	modelName = "m"
	// waitLimit bounds every wait for a condition.
	waitLimit = 30 * time.Second
)

// simBin is cmd/sim, built once for the package's tests.
var simBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tandem-outlier-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	simBin = filepath.Join(dir, "sim")
	if out, err := exec.Command("go", "build", "-o", simBin, "../../cmd/sim").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building cmd/sim: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// podSpec is one simulated vLLM pod: role "prefill", "decode" or "" (a combined standard pod);
// a sidecar decode pod runs the prefill leg itself (llm-d's routing sidecar, labelled so).
type podSpec struct {
	name, role, roleset string
	sidecar             bool
}

// pdPods is two rolesets, rs-a and rs-b, of one prefill and one decode pod each.
func pdPods(rolesets ...string) []podSpec {
	var out []podSpec
	for _, rs := range rolesets {
		out = append(out, podSpec{name: "prefill-" + rs, role: "prefill", roleset: "rs-" + rs},
			podSpec{name: "decode-" + rs, role: "decode", roleset: "rs-" + rs})
	}
	return out
}

// simPod is a cmd/sim process serving one pod on a fixed 127.0.0.1 port (kept across restarts).
type simPod struct {
	t *testing.T
	podSpec
	port int
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// podLine is the JSON line cmd/sim prints once a pod listens.
type podLine struct {
	HostPort string `json:"host_port"`
}

func (p *simPod) hostPort() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }
func (p *simPod) url() string      { return "http://" + p.hostPort() }

// start runs the process (on p.port when set, else a free port) and waits until it listens.
func (p *simPod) start() {
	p.t.Helper()
	args := []string{"-name", p.name, "-engine", "vllm", "-model", modelName, "-time-scale", "1",
		"-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), "-default-max-tokens", "24"}
	if p.role != "" {
		args = append(args, "-role", p.role)
	}
	if p.sidecar {
		args = append(args, "-routing-sidecar")
	}
	for attempt := 0; ; attempt++ {
		cmd := exec.Command(simBin, args...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			p.t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			p.t.Fatal(err)
		}
		done := make(chan struct{})
		lines := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			if sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
			_, _ = io.Copy(io.Discard, stdout)
		}()
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case line, ok := <-lines:
			var pl podLine
			if ok && json.Unmarshal([]byte(line), &pl) == nil {
				_, port, _ := net.SplitHostPort(pl.HostPort)
				p.port, _ = strconv.Atoi(port)
				p.mu.Lock()
				p.cmd, p.done = cmd, done
				p.mu.Unlock()
				return
			}
			<-done
			// A restart on the port it had may race the kernel releasing it: try again briefly.
			if attempt < 20 && strings.Contains(stderr.String(), "address already in use") {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			p.t.Fatalf("%s did not start: %q %s", p.name, line, stderr.String())
		case <-time.After(waitLimit):
			_ = cmd.Process.Kill()
			p.t.Fatalf("%s did not print its pod line", p.name)
		}
	}
}

// kill SIGKILLs the process and waits for it to be gone: its port refuses connections.
func (p *simPod) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// faults sets the pod's injected faults (sim.Faults as JSON); "" clears them.
func (p *simPod) faults(js string) {
	p.t.Helper()
	method, body := http.MethodPost, strings.NewReader(js)
	if js == "" {
		method, body = http.MethodDelete, strings.NewReader("")
	}
	req, _ := http.NewRequest(method, p.url()+"/sim/faults", body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatalf("%s faults: %v", p.name, err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		p.t.Fatalf("%s faults %s: %s", p.name, js, resp.Status)
	}
}

// received is how many completion requests the pod has recorded.
func (p *simPod) received() int {
	p.t.Helper()
	resp, err := http.Get(p.url() + "/sim/requests")
	if err != nil {
		p.t.Fatalf("%s requests: %v", p.name, err)
	}
	defer resp.Body.Close()
	var recs []struct {
		Path string `json:"path"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&recs); err != nil {
		p.t.Fatalf("%s requests: %v", p.name, err)
	}
	n := 0
	for _, r := range recs {
		if strings.HasSuffix(r.Path, "completions") {
			n++
		}
	}
	return n
}

// inFlight is how many requests the engine holds now (running and waiting, as /sim/stats says).
func (p *simPod) inFlight() int {
	p.t.Helper()
	resp, err := http.Get(p.url() + "/sim/stats")
	if err != nil {
		p.t.Fatalf("%s stats: %v", p.name, err)
	}
	defer resp.Body.Close()
	var st struct{ Running, Waiting int }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		p.t.Fatalf("%s stats: %v", p.name, err)
	}
	return st.Running + st.Waiting
}

func (p *simPod) labels() map[string]string {
	l := map[string]string{pool.LabelModelName: modelName, pool.LabelEngine: pool.EngineVLLM}
	if p.role != "" {
		l[pool.LabelRoleName], l[pool.LabelRolesetName] = p.role, p.roleset
	}
	if p.sidecar {
		l[pool.LabelLLMDRole] = p.role // how llm-d's decode pods with the routing sidecar show it
	}
	return l
}

func (p *simPod) annotations() map[string]string {
	rc := ""
	if p.role == "" {
		rc = `,"routingConfig":{"combined":true}`
	}
	return map[string]string{pool.AnnotationConfig: `{"profiles":{"default":{"routingStrategy":"pd"` + rc + `}}}`}
}

// source says where Tandem reads the pool from.
type source string

const (
	fileSource source = "file"
	kubeSource source = "kubernetes"
)

// stack is the pods, Tandem on a pool that is never updated, and the gateway.
type stack struct {
	t      *testing.T
	pods   map[string]*simPod
	order  []string
	tandem *app.App
	gwURL  string
	client *http.Client
}

// stackOptions describe a stack.
type stackOptions struct {
	source source
	// env is added to Tandem's test environment (scrapes every 200 ms, short ejections).
	env map[string]string
	// upstreamTimeout is the gateway's UpstreamTimeout (Envoy's route timeout).
	upstreamTimeout time.Duration
	// streamEnd is how the gateway ends an ext_proc stream early: gateway.EndReset ("" too)
	// or gateway.EndEnvoy (half-close, then reset).
	streamEnd string
	// late: the pods get their ports but are not started; the test starts them after Tandem.
	late bool
}

// baseEnv is what every stack's Tandem runs with, time shortened for tests: engines scraped
// every 200 ms, outlier detection swept every 500 ms, ejections of 3 s and up, demotions of 1 s
// per consecutive failure (the defaults are 1 s, 10 s, 30 s and 2 s).
func baseEnv() map[string]string {
	return map[string]string{
		"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "200",
		"TANDEM_OUTLIER_INTERVAL_MS":            "500",
		"TANDEM_OUTLIER_BASE_EJECTION_TIME_MS":  "3000",
		"TANDEM_OUTLIER_RECENT_FAILURE_MS":      "1000",
	}
}

func newStack(t *testing.T, o stackOptions, specs ...podSpec) *stack {
	t.Helper()
	s := &stack{t: t, pods: map[string]*simPod{}, client: &http.Client{Timeout: 20 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	for _, sp := range specs {
		p := &simPod{t: t, podSpec: sp}
		if o.late {
			p.port = freePort(t)
		} else {
			p.start()
		}
		t.Cleanup(p.kill)
		s.pods[sp.name] = p
		s.order = append(s.order, sp.name)
	}
	env := baseEnv()
	for k, v := range o.env {
		env[k] = v
	}
	switch o.source {
	case kubeSource:
		s.tandem = s.startKube(env)
	default:
		path := filepath.Join(t.TempDir(), "endpoints.yaml")
		f := demo.EndpointsFile{Pool: map[string]string{"name": "outlier", "namespace": "default"}}
		for _, n := range s.order {
			p := s.pods[n]
			f.Endpoints = append(f.Endpoints, demo.FileEndpoint{Name: n, Address: "127.0.0.1", Port: p.port,
				Labels: p.labels(), Annotations: p.annotations()})
		}
		if err := f.Write(path); err != nil {
			t.Fatal(err)
		}
		s.tandem = apptest.Start(t, apptest.Options{Args: []string{"--endpoints-file=" + path}, Env: env, Limit: waitLimit})
	}
	s.gwURL = serveGateway(t, gateway.Options{EPPAddr: s.tandem.ExtProcAddr(), TLS: true, DecisionTimeout: 10 * time.Second,
		UpstreamTimeout: o.upstreamTimeout, StreamEnd: o.streamEnd})
	t.Cleanup(s.checkReleased)
	return s
}

// startKube puts the pods in a real kube-apiserver (an InferencePool and Ready pods on
// 127.0.0.1, each naming its port with model.aibrix.ai/port) and starts Tandem on it.
func (s *stack) startKube(env map[string]string) *app.App {
	t := s.t
	kenv := testenv.Start(t)
	ns := kenv.Namespace(t, "outlier")
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	const selKey, selValue = "app", "tandem-outlier-sim"
	ip := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "outlier-pool", Namespace: ns},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{selKey: selValue}},
			TargetPorts:       []infv1.Port{{Number: 8000}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "tandem", Port: &infv1.Port{Number: 9002}},
		},
	}
	if err := kenv.Client.Create(ctx, ip); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.order {
		p := s.pods[n]
		labels := p.labels()
		labels[selKey] = selValue
		labels[pool.LabelModelPort] = strconv.Itoa(p.port)
		obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ns, Labels: labels, Annotations: p.annotations()},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
		if err := kenv.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		if err := testenv.SetPodStatus(ctx, kenv.Client, obj, "127.0.0.1", true); err != nil {
			t.Fatal(err)
		}
	}
	a := apptest.Start(t, apptest.Options{Args: []string{"--pool-name=outlier-pool", "--pool-namespace=" + ns}, Env: env,
		RestConfig: kenv.Config, Limit: waitLimit})
	eventually(t, "Tandem's pool to hold every pod", func() (bool, string) {
		n := len(a.Store().Load().Endpoints)
		return n == len(s.order), fmt.Sprintf("%d endpoints", n)
	})
	return a
}

// serveGateway serves the local gateway until the test ends and returns its base URL.
func serveGateway(t *testing.T, opts gateway.Options) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gateway.Serve(ctx, ln, opts) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("gateway did not stop within 10s")
		}
	})
	return "http://" + ln.Addr().String()
}

// freePort is a 127.0.0.1 port nothing listens on now, below the kernel's ephemeral range
// when it can be: a late pod's port stays unbound until the test starts its engine, and a
// port the kernel hands out could meanwhile become the local end of some outgoing
// connection (bind: address already in use).
func freePort(t *testing.T) int {
	t.Helper()
	low := 32768 // Linux's default start of ip_local_port_range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	for i := 0; low > 11000 && i < 200; i++ {
		port := 10000 + rand.IntN(low-11000)
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			ln.Close()
			return port
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// key is the pool's endpoint key of a pod.
func (s *stack) key(name string) string {
	for _, e := range s.tandem.Store().Load().Endpoints {
		if e.Name == name {
			return e.Key()
		}
	}
	s.t.Fatalf("no endpoint %s in the pool", name)
	return ""
}

// checkReleased fails the test unless every tracker and token-load ledger charge went back to
// exactly zero (bounded wait: the last streams close a moment after their answers).
func (s *stack) checkReleased() {
	var last string
	deadline := time.Now().Add(waitLimit)
	for {
		last = s.held()
		if last == "" {
			result(s.t, "trackers_and_ledgers_at_end", 0)
			return
		}
		if time.Now().After(deadline) {
			s.t.Errorf("trackers or ledgers not released after the scenario: %s", last)
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a bounded wait; no event marks the last release
	}
}

func (s *stack) held() string {
	var out []string
	c := s.tandem.Cascade()
	for _, e := range s.tandem.Store().Load().Endpoints {
		k := e.Key()
		for what, n := range map[string]int64{"running": s.tandem.Deps().Running.InFlight(k),
			"prefill": c.PrefillInFlight(k), "pending_decode": c.PendingDecode(k)} {
			if n != 0 {
				out = append(out, fmt.Sprintf("%s[%s]=%d", what, e.Name, n))
			}
		}
	}
	tl := s.tandem.TokenLoad()
	if n := tl.Prefill.Open(); n != 0 {
		out = append(out, fmt.Sprintf("prefill ledger charges=%d", n))
	}
	if n := tl.Decode.Open(); n != 0 {
		out = append(out, fmt.Sprintf("decode ledger charges=%d", n))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// counter sums a Tandem counter over the series matching labels.
func (s *stack) counter(name string, labels map[string]string) float64 {
	s.t.Helper()
	mfs, err := s.tandem.Gatherer().Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metric
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// eventually polls cond every 10 ms until it holds, failing the test after waitLimit.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %s", waitLimit, what, why)
		}
		time.Sleep(10 * time.Millisecond) // poll interval of a bounded wait
	}
}

// chatBody is a chat completion of about 100 prompt tokens; n makes each prompt its own.
func chatBody(n int) []byte {
	prompt := fmt.Sprintf("request %d: ", n) + strings.Repeat("lorem ipsum dolor sit amet ", 15)
	b, _ := json.Marshal(map[string]any{"model": modelName, "max_tokens": 24,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	return b
}

// shot is one request of a load run.
type shot struct {
	sent, done time.Time
	status     int
	pod        string // X-Sim-Pod: the pod that answered
	err        error
	body       string // the start of a failed answer
}

func (sh *shot) ok() bool { return sh.err == nil && sh.status == http.StatusOK }

func (sh *shot) String() string {
	if sh.err != nil {
		return "error: " + sh.err.Error()
	}
	return fmt.Sprintf("%d from %q: %.200s", sh.status, sh.pod, sh.body)
}

// load sends requests at a steady rate (open loop: one every 1/rate, whatever the answers).
type load struct {
	s      *stack
	mu     sync.Mutex
	shots  []*shot
	wg     sync.WaitGroup
	stop   chan struct{}
	ticker sync.WaitGroup
}

func (s *stack) startLoad(rate float64) *load {
	l := &load{s: s, stop: make(chan struct{})}
	l.ticker.Add(1)
	go func() {
		defer l.ticker.Done()
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-l.stop:
				return
			case <-tick.C:
				sh := &shot{sent: time.Now()}
				l.mu.Lock()
				l.shots = append(l.shots, sh)
				l.mu.Unlock()
				l.wg.Add(1)
				go func() {
					defer l.wg.Done()
					l.fire(sh, n)
				}()
			}
		}
	}()
	return l
}

func (l *load) fire(sh *shot, n int) {
	req, _ := http.NewRequest(http.MethodPost, l.s.gwURL+"/v1/chat/completions", bytes.NewReader(chatBody(n)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.s.client.Do(req)
	var status int
	var pod, body string
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		status, pod, err = resp.StatusCode, resp.Header.Get("X-Sim-Pod"), rerr
		if status != http.StatusOK {
			body = string(b)
		}
	}
	l.mu.Lock()
	sh.done, sh.status, sh.pod, sh.err, sh.body = time.Now(), status, pod, err, body
	l.mu.Unlock()
}

// inFlight is how many requests were sent and have no answer yet.
func (l *load) inFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, sh := range l.shots {
		if sh.done.IsZero() {
			n++
		}
	}
	return n
}

// finish stops sending, waits for every answer and returns the run.
func (l *load) finish() []*shot {
	close(l.stop)
	l.ticker.Wait()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*shot(nil), l.shots...)
}

// servedBy counts the successful answers per pod among shots sent in [from, to).
func servedBy(shots []*shot, from, to time.Time) map[string]int {
	out := map[string]int{}
	for _, sh := range shots {
		if sh.ok() && !sh.sent.Before(from) && sh.sent.Before(to) {
			out[sh.pod]++
		}
	}
	return out
}

// failures lists the failed shots sent in [from, to).
func failures(shots []*shot, from, to time.Time) []*shot {
	var out []*shot
	for _, sh := range shots {
		if !sh.ok() && !sh.sent.Before(from) && sh.sent.Before(to) {
			out = append(out, sh)
		}
	}
	return out
}

// sentIn counts the shots sent in [from, to).
func sentIn(shots []*shot, from, to time.Time) int {
	n := 0
	for _, sh := range shots {
		if !sh.sent.Before(from) && sh.sent.Before(to) {
			n++
		}
	}
	return n
}

// lastFailure is when the last failed shot of the run ended (zero when none failed).
func lastFailure(shots []*shot) time.Time {
	var last time.Time
	for _, sh := range shots {
		if !sh.ok() && sh.done.After(last) {
			last = sh.done
		}
	}
	return last
}

// watchEjection records when Tandem ejects the endpoint (polled every 2 ms, from now).
func (s *stack) watchEjection(name string) func() time.Time {
	key := s.key(name)
	var mu sync.Mutex
	var at time.Time
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if s.tandem.Health().Ejected(key) {
					mu.Lock()
					if at.IsZero() {
						at = time.Now()
					}
					mu.Unlock()
				}
			}
		}
	}()
	s.t.Cleanup(func() { close(stop) })
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return at
	}
}

// readmitted restarts the named (killed) pod on its port and returns how long Tandem took to
// take it back into rotation (its ejection time passed and a scrape or probe succeeded).
func (s *stack) readmitted(name string) time.Duration {
	s.t.Helper()
	key := s.key(name)
	s.pods[name].start()
	restarted := time.Now()
	eventually(s.t, name+" to return", func() (bool, string) { return !s.tandem.Health().Ejected(key), "still ejected" })
	return time.Since(restarted)
}

// result prints one measured value in the RESULT format (go test -v shows it).
func result(t *testing.T, name string, v any) {
	t.Helper()
	t.Logf("RESULT %s=%v", name, v)
}

// ms is a duration in whole milliseconds, for RESULT lines.
func ms(d time.Duration) int64 { return d.Milliseconds() }

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}
