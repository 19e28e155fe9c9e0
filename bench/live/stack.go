package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/pool"
)

// proc is one child process the bench started; stop ends it (SIGTERM, SIGKILL after 5 s).
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan error
	log  string
}

// start runs bin with args (and env added), its output in dir/name.log.
func start(dir, name, bin string, args, env []string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan error, 1), log: logPath}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	return p, nil
}

// stop ends the process and waits for it.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// signal continues (SIGCONT) or stops (SIGSTOP) the process.
func (p *proc) signal(run bool) {
	sig := syscall.SIGSTOP
	if run {
		sig = syscall.SIGCONT
	}
	_ = p.cmd.Process.Signal(sig)
}

// exited is an error when the process is no longer running.
func (p *proc) exited() error {
	select {
	case err := <-p.done:
		p.done <- err
		return fmt.Errorf("%s exited (%v); the end of its log %s:\n%s", p.name, err, p.log, logTail(p.log))
	default:
		return nil
	}
}

// logTail is the last lines of a log, for an error.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-8):], "\n")
}

// shape is a pool of rolesets of prefill and decode pods plus standard pods.
type shape struct{ rolesets, prefill, decode, standard int }

var shapeRE = regexp.MustCompile(`^(\d+)x(\d+)p(\d+)d(?:\+(\d+)s)?$`)

func parseShape(s string) (shape, error) {
	m := shapeRE.FindStringSubmatch(s)
	if m == nil {
		return shape{}, fmt.Errorf("-pods %q: want <rolesets>x<prefill>p<decode>d[+<standard>s], e.g. 2x1p1d+2s", s)
	}
	n := func(x string) int { v, _ := strconv.Atoi(x); return v }
	sh := shape{n(m[1]), n(m[2]), n(m[3]), n(m[4])}
	if sh.rolesets < 1 || sh.prefill < 1 || sh.decode < 1 {
		return shape{}, fmt.Errorf("-pods %q: need at least one roleset with a prefill and a decode pod", s)
	}
	return sh, nil
}

func (s shape) String() string {
	return fmt.Sprintf("%dx%dp%dd+%ds", s.rolesets, s.prefill, s.decode, s.standard)
}

// pod is one simulator process (and maybe llm-d's routing sidecar in front of it)
// and how the pool names it.
type pod struct {
	name, role, roleset string // role: prefill, decode or standard
	host                string
	port                int
	p, sidecar          *proc
}

func (p *pod) addr() string { return p.host + ":" + strconv.Itoa(p.port) }

// wholeRequest says whether the pod serves a request from prompt to last token by itself
// (decode and standard pods; prefill pods only prefill).
func (p *pod) wholeRequest() bool { return p.role != "prefill" }

// podPort is every pod's port when the pods have addresses of their own; the simulator
// behind a routing sidecar listens on simPort.
const (
	podPort = 8000
	simPort = 8200
)

// startPods runs one llm-d simulator per pod of the shape and waits until each answers
// /v1/models. Without pn every pod is on 127.0.0.1 with a port of its own (the pool file names
// each pod's port); with pn every pod is in its own network namespace on podPort. With
// bins.sidecar the decode and standard pods run llm-d's routing sidecar on the pod's port in
// front of the simulator, as llm-d deploys its decode pods. Every pod runs engine e but those
// override names (by pod name).
func startPods(ctx context.Context, dir string, bins binaries, sh shape, e engine, override map[string]engine, seed uint64, pn *podNet) ([]*pod, error) {
	var pods []*pod
	add := func(name, role, roleset string) { pods = append(pods, &pod{name: name, role: role, roleset: roleset}) }
	for r := range sh.rolesets {
		rs := fmt.Sprintf("rs%d", r)
		for k := range sh.prefill {
			add(fmt.Sprintf("%s-prefill-%d", rs, k), "prefill", rs)
		}
		for k := range sh.decode {
			add(fmt.Sprintf("%s-decode-%d", rs, k), "decode", rs)
		}
	}
	for k := range sh.standard {
		add(fmt.Sprintf("standard-%d", k), "standard", "")
	}
	sidecars := 0
	for _, p := range pods {
		if bins.sidecar != "" && p.wholeRequest() {
			sidecars++
		}
	}
	var ports []int // without pn: the pods' ports, then the simulators' behind sidecars
	if pn == nil {
		var err error
		if ports, err = demo.FreePorts(len(pods) + sidecars); err != nil {
			return nil, err
		}
	}
	behind := len(pods)
	for i, p := range pods {
		seedArgs := int64(seed)*1000 + int64(i)
		e := e
		if o, ok := override[p.name]; ok {
			e = o
		}
		wrap := func(bin string, args []string) (string, []string) { return bin, args }
		if pn == nil {
			p.host, p.port = "127.0.0.1", ports[i]
		} else {
			p.host, p.port = pn.ip(i), podPort
			wrap = func(bin string, args []string) (string, []string) { return pn.wrap(i, bin, args) }
		}
		port := p.port // the simulator's
		if bins.sidecar != "" && p.wholeRequest() {
			if port = simPort; pn == nil {
				port, behind = ports[behind], behind+1
			}
			bin, args := wrap(bins.sidecar, []string{"--port", strconv.Itoa(p.port), "--vllm-port", strconv.Itoa(port), "--secure-proxy=false"})
			var err error
			if p.sidecar, err = start(dir, p.name+"-sidecar", bin, args, nil); err != nil {
				stopPods(pods)
				return nil, err
			}
		}
		bin, args := wrap(bins.sim, e.args(port, seedArgs))
		var err error
		if p.p, err = start(dir, p.name, bin, args, nil); err != nil {
			stopPods(pods)
			return nil, err
		}
	}
	for _, p := range pods {
		if err := waitHTTP(ctx, "http://"+p.addr()+"/v1/models", p.p, 30*time.Second); err != nil {
			stopPods(pods)
			return nil, err
		}
	}
	return pods, nil
}

func stopPods(pods []*pod) {
	for _, p := range pods {
		for _, x := range []*proc{p.sidecar, p.p} {
			if x != nil {
				x.stop()
			}
		}
	}
}

// waitUntil calls try every interval until it returns nil, p exits, ctx ends or limit passes:
// the error says what was awaited, try's last answer and where p's log is.
func waitUntil(ctx context.Context, p *proc, limit, every time.Duration, what string, try func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := try()
		if err == nil {
			return nil
		}
		if e := p.exited(); e != nil {
			return e
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s within %v (last: %v); the log of %s: %s", what, limit, err, p.name, p.log)
		}
		time.Sleep(every)
	}
}

// waitHTTP polls url until it answers 200, the process exits or limit passes.
func waitHTTP(ctx context.Context, url string, p *proc, limit time.Duration) error {
	return waitUntil(ctx, p, limit, 50*time.Millisecond, p.name+" did not answer "+url, func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	})
}

// writePool writes the pool file Tandem reads (--endpoints-file): every pod labelled for the
// model and engine, PD pods with role and roleset, standard pods declared combined in the
// model.aibrix.ai/config annotation.
func writePool(path string, pods []*pod) error {
	annot := func(combined bool) map[string]string {
		rc := config.RoutingConfig{Combined: combined}
		mc := config.ModelConfig{DefaultProfile: "default", Profiles: map[string]config.Profile{"default": {RoutingConfig: &rc}}}
		b, _ := json.Marshal(mc)
		return map[string]string{pool.AnnotationConfig: string(b)}
	}
	f := demo.EndpointsFile{Pool: map[string]string{"name": "live", "namespace": "default"}}
	for _, p := range pods {
		labels := map[string]string{pool.LabelModelName: modelName, pool.LabelEngine: pool.EngineVLLM}
		if p.role != "standard" {
			labels[pool.LabelRoleName] = p.role
			labels[pool.LabelRolesetName] = p.roleset
		}
		if p.sidecar != nil && p.role == "decode" {
			// llm-d's role label: the decode pod runs llm-d's routing sidecar, so Tandem's
			// default (auto) hand-off names the prefill pod for it instead of running the
			// prefill leg itself, the data path llm-d's EPP uses.
			labels["llm-d.ai/role"] = "decode"
		}
		f.Endpoints = append(f.Endpoints, demo.FileEndpoint{Name: p.name, Address: p.host, Port: p.port,
			Labels: labels, Annotations: annot(p.role == "standard")})
	}
	return f.Write(path)
}

// tandem is one Tandem EPP process and the local gateway in front of it.
type tandem struct {
	epp, gw *proc
	url     string // the gateway's base URL
	metrics string // the EPP's metrics URL
}

func (t *tandem) stop() {
	if t.gw != nil {
		t.gw.stop()
	}
	if t.epp != nil {
		t.epp.stop()
	}
}

// startTandem runs cmd/epp on the pool file with the routing strategy (and env, NAME=value
// settings), and cmd/gateway in Envoy's stream-end mode in front of it, and waits until both
// serve.
func startTandem(ctx context.Context, dir string, bins binaries, poolFile, name, strategy string, env ...string) (*tandem, error) {
	ports, err := demo.FreePorts(5)
	if err != nil {
		return nil, err
	}
	grpcPort, healthPort, metricsPort, gwPort := ports[0], ports[1], ports[2], ports[3]
	t := &tandem{}
	t.epp, err = start(dir, name+"-epp", bins.epp, []string{
		"--endpoints-file", poolFile,
		"--bind-address", "127.0.0.1",
		"--grpc-port", strconv.Itoa(grpcPort),
		"--grpc-health-port", strconv.Itoa(healthPort),
		"--metrics-port", strconv.Itoa(metricsPort),
		"--zap-log-level", "info",
	}, append([]string{"ROUTING_ALGORITHM=" + strategy}, env...))
	if err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { err := <-t.epp.done; t.epp.done <- err; exited <- err }()
	if err := demo.WaitServing(ctx, "127.0.0.1:"+strconv.Itoa(healthPort), exited, 60*time.Second); err != nil {
		t.stop()
		return nil, fmt.Errorf("tandem (%s): %w; its log: %s", strategy, err, t.epp.log)
	}
	gwAddr := "127.0.0.1:" + strconv.Itoa(gwPort)
	t.gw, err = start(dir, name+"-gateway", bins.gateway, []string{
		"--listen", gwAddr, "--epp", "127.0.0.1:" + strconv.Itoa(grpcPort), "--stream-end", "envoy",
	}, nil)
	if err != nil {
		t.stop()
		return nil, err
	}
	if err := waitTCP(ctx, gwAddr, t.gw, 30*time.Second); err != nil {
		t.stop()
		return nil, err
	}
	t.url = "http://" + gwAddr
	t.metrics = "http://127.0.0.1:" + strconv.Itoa(metricsPort) + "/metrics"
	if err := waitRouted(ctx, t.url, t.epp, 30*time.Second); err != nil {
		t.stop()
		return nil, err
	}
	return t, nil
}

// waitTCP waits until addr accepts connections.
func waitTCP(ctx context.Context, addr string, p *proc, limit time.Duration) error {
	return waitUntil(ctx, p, limit, 50*time.Millisecond, p.name+" did not listen on "+addr, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// binaries are the programs a run starts.
type binaries struct {
	sim, epp, gateway string
	llmdEPP, sidecar  string // llm-d's EPP and routing sidecar; "" leaves llm-d out
}

// buildTandem compiles cmd/epp and cmd/gateway of the repository at root into dir.
func buildTandem(ctx context.Context, root, dir string) (binaries, error) {
	b := binaries{epp: filepath.Join(dir, "epp"), gateway: filepath.Join(dir, "gateway")}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/epp", "./cmd/gateway")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return b, fmt.Errorf("building ./cmd/epp and ./cmd/gateway: %w\n%s", err, out)
	}
	return b, nil
}

// served is the requests the pod finished so far: the sum of its vllm:request_success_total
// series (a prefill leg counts as one on a prefill pod).
func (p *pod) served(ctx context.Context) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr()+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	total := 0.0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "vllm:request_success_total") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s /metrics: %q: %w", p.name, line, err)
		}
		total += v
	}
	return total, sc.Err()
}

// servedByRole is what each role's pods finished so far.
func servedByRole(ctx context.Context, pods []*pod) (map[string]float64, error) {
	out := map[string]float64{}
	for _, p := range pods {
		n, err := p.served(ctx)
		if err != nil {
			return nil, err
		}
		out[p.role] += n
	}
	return out, nil
}

// waitRouted sends a one-token completion through the router at base until one succeeds:
// the router then knows the pool (a gRPC health SERVING may come before its first sync).
func waitRouted(ctx context.Context, base string, p *proc, limit time.Duration) error {
	body := fmt.Sprintf(`{"model":%q,"prompt":"the of and to","max_tokens":1}`, modelName)
	return waitUntil(ctx, p, limit, 200*time.Millisecond, "no request through "+base+" succeeded", func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strictRefusal(resp, b) {
			return nil
		}
		return fmt.Errorf("HTTP %d %.300s", resp.StatusCode, b)
	})
}

// strictRefusal reports Tandem's strict transfer proof withholding a PD answer it could not
// verify (docs/proof.md): the request went through both pods, which is all a readiness check
// needs.
func strictRefusal(resp *http.Response, body []byte) bool {
	return resp.StatusCode == http.StatusBadGateway && resp.Header.Get("X-Error-Pd-Decode") != "" &&
		strings.Contains(string(body), "transfer proof strict")
}
