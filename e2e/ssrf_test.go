package e2e

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/demo"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/sim"
)

// canary is a listener on 127.0.0.1 that no client-chosen value may make any pod connect to.
type canary struct {
	ln    net.Listener
	mu    sync.Mutex
	conns int
}

func startCanary(t *testing.T) *canary {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &canary{ln: ln}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.conns++
			c.mu.Unlock()
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return c
}

func (c *canary) addr() string { return c.ln.Addr().String() }

func (c *canary) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conns
}

// ssrfVector is one way a client could try to make a pod connect to a host of its choosing:
// a top-level body member (raw JSON, "%s" is the canary's host:port, %h its host, %p its
// port) or request headers.
type ssrfVector struct {
	name   string
	member string
	header map[string]string
}

const trtID = 1 << 42 // a TensorRT-LLM disagg_request_id as the simulator accepts them

func ssrfVectors(target string) []ssrfVector {
	host, port, _ := net.SplitHostPort(target)
	kv := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e","remote_block_ids":[1],"remote_host":"` + host + `","remote_port":` + port + `}`
	opaque := base64.StdEncoding.EncodeToString(fmt.Appendf(nil, `{"kv":%q,"id":%d}`, target, trtID))
	return []ssrfVector{
		{name: "vLLM kv_transfer_params", member: `"kv_transfer_params":` + kv},
		{name: "vLLM kv_transfer_params, escaped key", member: `"kv_transfer\u005fparams":` + kv},
		{name: "vLLM kv_transfer_params twice", member: `"kv_transfer_params":null,"kv_transfer_params":` + kv},
		{name: "AIBrix NIXL disagg_prefill_resp", member: `"disagg_prefill_resp":{"kv_transfer_params":` + kv + `}`},
		{name: "SGLang bootstrap_host/port/room", member: `"bootstrap_host":"` + host + `","bootstrap_port":` + port + `,"bootstrap_room":7,"rid":"r-1"`},
		{name: "TensorRT-LLM generation_first ctx_info_endpoint", member: fmt.Sprintf(
			`"disaggregated_params":{"request_type":"generation_only","disagg_request_id":%d,"ctx_request_id":%d,"ctx_info_endpoint":"tcp://%s","ctx_dp_rank":0,"schedule_style":1}`, trtID, trtID, target)},
		{name: "TensorRT-LLM encoded_opaque_state", member: fmt.Sprintf(
			`"disaggregated_params":{"request_type":"generation_only","disagg_request_id":%d,"ctx_request_id":%d,"first_gen_tokens":[1],"encoded_opaque_state":%q}`, trtID, trtID, opaque)},
		{name: "llm-d sidecar x-prefiller-host-port", header: map[string]string{"X-Prefiller-Host-Port": target}},
		{name: "llm-d sidecar encoder and data-parallel targets", header: map[string]string{"X-Encoder-Hosts-Ports": target, "X-Data-Parallel-Host-Port": target}},
		{name: "the gateway's destination", header: map[string]string{"X-Gateway-Destination-Endpoint": target, "Test-Epp-Endpoint-Selection": host}},
	}
}

// ssrfBody is a chat or completions request carrying the vector's member.
func ssrfBody(chat bool, v ssrfVector) []byte {
	b := `{"model":"` + modelName + `","max_tokens":2,`
	if chat {
		b += `"messages":[{"role":"user","content":"ssrf probe"}]`
	} else {
		b += `"prompt":"ssrf probe"`
	}
	if v.member != "" {
		b += "," + v.member
	}
	return []byte(b + "}")
}

// ssrfStack is a prefill/decode pair and a standard pod of one engine behind Tandem (one
// hand-off mode) and the local gateway.
type ssrfStack struct {
	pods map[string]*sim.Server
	gw   string
}

func newSSRFStack(t *testing.T, engine, handoff string, extraArgs ...string) *ssrfStack {
	t.Helper()
	p := sim.DefaultParams()
	p.KVHold, p.BootstrapTimeout = 2000, 500 // 2 s and 0.5 s of wall time at 0.001
	st := &ssrfStack{pods: map[string]*sim.Server{}}
	var entries []demo.FileEndpoint
	for _, spec := range []struct{ name, role string }{{"prefill-0", sim.RolePrefill}, {"decode-0", sim.RoleDecode}, {"standard-0", sim.RoleStandard}} {
		s := sim.StartForTest(t, sim.PodConfig{Name: spec.name, Engine: engine, Role: spec.role, Model: modelName,
			Params: p, TimeScale: 0.001, RoutingSidecar: engine == sim.EngineVLLM && spec.role == sim.RoleDecode})
		st.pods[spec.name] = s
		labels := map[string]string{pool.LabelModelName: modelName, pool.LabelEngine: engine}
		ann := map[string]string{}
		if spec.role != sim.RoleStandard {
			labels["role-name"], labels["roleset-name"] = spec.role, "rs-0"
		}
		if engine == sim.EngineSGLang && spec.role == sim.RolePrefill {
			ann[pool.AnnotationSGLangBootstrapPort] = strconv.Itoa(s.BootstrapPort())
		}
		entries = append(entries, demo.SimEndpoint(spec.name, s, labels, ann))
	}
	path := t.TempDir() + "/endpoints.yaml"
	if err := (demo.EndpointsFile{Endpoints: entries}).Write(path); err != nil {
		t.Fatal(err)
	}
	env := defaultEnv(map[string]string{"TANDEM_PD_HANDOFF": handoff})
	if engine == sim.EngineTRTLLM {
		env["AIBRIX_TRT_SCHEDULE_STYLE"] = "generation_first"
	}
	tandem := startTandem(t, append([]string{"--endpoints-file=" + path}, extraArgs...), env, nil)
	st.gw = startGateway(t, tandem.ExtProcAddr())
	return st
}

// TestNoClientValueMakesAPodConnectWhereItSays: a canary listens on 127.0.0.1. Every body field
// and header a client could use to name a host (vLLM kv_transfer_params and AIBrix's
// disagg_prefill_resp, SGLang bootstrap_*, TensorRT-LLM disaggregated_params, the llm-d
// sidecar's target headers, the gateway's destination), sent through the local gateway to
// Tandem and real simulated pods of each engine, with each hand-off mode and every routing
// strategy a client can ask for, never makes anything connect to it. (Issue 11, defect 3: with
// routing-strategy: random the client's kv_transfer_params reached the decode pod, which pulled
// KV from the host it named.) First, each vector is shown to work when sent straight to a pod:
// without Tandem's hygiene, the canary would hear from it.
func TestNoClientValueMakesAPodConnectWhereItSays(t *testing.T) {
	ctx := testCtx(t, 4*time.Minute)
	can := startCanary(t)
	vectors := ssrfVectors(can.addr())
	client := &http.Client{Timeout: 10 * time.Second}
	send := func(url string, body []byte, hdr map[string]string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}

	engines := []string{sim.EngineVLLM, sim.EngineSGLang, sim.EngineTRTLLM}
	t.Run("control: each vector reaches the canary when sent straight to a pod", func(t *testing.T) {
		want := map[string]string{ // vector -> engine whose decode pod acts on it
			"vLLM kv_transfer_params": sim.EngineVLLM, "vLLM kv_transfer_params, escaped key": sim.EngineVLLM,
			"AIBrix NIXL disagg_prefill_resp": sim.EngineVLLM,
			"SGLang bootstrap_host/port/room": sim.EngineSGLang, "TensorRT-LLM generation_first ctx_info_endpoint": sim.EngineTRTLLM,
			"TensorRT-LLM encoded_opaque_state": sim.EngineTRTLLM, "llm-d sidecar x-prefiller-host-port": sim.EngineVLLM,
		}
		decodes := map[string]*sim.Server{}
		for _, e := range engines {
			decodes[e] = sim.StartForTest(t, sim.PodConfig{Name: "direct-" + e, Engine: e, Role: sim.RoleDecode, Model: modelName,
				TimeScale: 0.001, RoutingSidecar: e == sim.EngineVLLM})
		}
		for _, v := range vectors {
			e, ok := want[v.name]
			if !ok {
				// Headers only a sidecar or a gateway acts on, and a duplicated key (real engines
				// keep the last one; the simulator refuses duplicates).
				continue
			}
			before := can.count()
			send(decodes[e].URL()+"/v1/chat/completions", ssrfBody(true, v), v.header)
			if can.count() == before {
				t.Errorf("%s sent straight to a %s decode pod did not reach the canary: the vector is not a real one", v.name, e)
			}
		}
	})
	if t.Failed() {
		return
	}
	base := can.count()

	for _, engine := range engines {
		for _, handoff := range []string{"sidecar", "epp"} {
			t.Run(engine+"/"+handoff, func(t *testing.T) {
				st := newSSRFStack(t, engine, handoff)
				for _, strategy := range []string{"", "pd", "random", "least-request", "prefix-cache"} {
					for _, v := range vectors {
						for _, chat := range []bool{true, false} {
							hdr := map[string]string{}
							for k, val := range v.header {
								hdr[k] = val
							}
							if strategy != "" {
								hdr["Routing-Strategy"] = strategy
							}
							path := "/v1/completions"
							if chat {
								path = "/v1/chat/completions"
							}
							before := can.count()
							send(st.gw+path, ssrfBody(chat, v), hdr)
							if n := can.count() - before; n != 0 {
								t.Errorf("strategy %q, %s, %s: the canary got %d connection(s)", strategy, v.name, path, n)
							}
						}
					}
				}
				// No pod ever saw a client-chosen target header either.
				for name, p := range st.pods {
					for _, r := range p.Requests() {
						for _, h := range []string{"X-Encoder-Hosts-Ports", "X-Data-Parallel-Host-Port", "X-Prefiller-Host-Port", "X-Gateway-Destination-Endpoint"} {
							if strings.Contains(r.Header.Get(h), can.addr()) {
								t.Errorf("pod %s got %s: %s", name, h, r.Header.Get(h))
							}
						}
					}
				}
			})
		}
	}
	if n := can.count() - base; n != 0 {
		t.Errorf("the canary got %d connection(s) in all", n)
	}
}
