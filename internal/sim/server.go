package sim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Engine names, as the model.aibrix.ai/engine label spells them.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	EngineTRTLLM = "trtllm"
)

// PodConfig.KVLoadFailurePolicy values.
const (
	KVLoadRecompute = "recompute"
	KVLoadFail      = "fail"
)

// Roles, as the model.aibrix.ai/role label spells them; "" is a standard (combined) pod.
const (
	RolePrefill  = "prefill"
	RoleDecode   = "decode"
	RoleStandard = ""
)

// Headers the simulator reads or writes.
const (
	// HeaderFault injects faults into one request: a comma list of [prefill-|decode-|standard-]action,
	// action = a status code (e.g. 500), "hang" (before the first token), "hang-after-N" (tokens),
	// "slow-DURATION" (before the response headers, e.g. slow-200ms), "pull-delay-DURATION" (a
	// decode leg waits before it pulls its KV, e.g. pull-delay-2s), "recompute" (a decode leg
	// ignores the transferred KV and prefills the prompt itself), or "wrong-kv-port" (a prefill
	// leg announces a KV port nothing listens on). A role prefix limits the
	// item to pods of that role, so one client header can fail only the prefill leg.
	HeaderFault = "X-Sim-Fault"
	// HeaderPrefiller is the llm-d routing sidecar's prefill target header.
	HeaderPrefiller = "X-Prefiller-Host-Port"
	// HeaderSidecarLeg marks the decode body a sidecar-mode pod built for itself (recorded only).
	HeaderSidecarLeg = "X-Sim-Sidecar-Leg"
)

// PodConfig describes one simulated pod.
type PodConfig struct {
	Name   string `json:"name"`   // shown in X-Sim-Pod and logs; default engine-role-port
	Engine string `json:"engine"` // vllm, sglang or trtllm
	Role   string `json:"role"`   // prefill, decode or "" (standard)
	Addr   string `json:"addr"`   // serving address; default 127.0.0.1:0
	// KVAddr is the pod's KV side channel (vLLM's NIXL side channel, SGLang's bootstrap
	// server, TensorRT-LLM's ctx_info_endpoint); default 127.0.0.1:0.
	KVAddr      string   `json:"kv_addr"`
	Model       string   `json:"model"`
	ExtraModels []string `json:"extra_models"` // more served names (LoRA adapters)
	// Params is the latency model; the zero value means DefaultParams().
	Params Params `json:"params"`
	// TimeScale multiplies every model time (0.01 runs 100× faster); 0 means 1.
	TimeScale float64 `json:"time_scale"`
	Faults    Faults  `json:"faults"`
	// RoutingSidecar makes a vLLM decode pod run the prefill leg itself, as the llm-d routing
	// sidecar does (NIXL v2), when a request carries x-prefiller-host-port.
	RoutingSidecar bool `json:"routing_sidecar"`
	// AnyRole lets any pod take any leg (real engines in kv_both mode); by default a prefill
	// leg sent to a decode pod, or the reverse, is a 400.
	AnyRole bool `json:"any_role"`
	// TRTParamsTopLevel puts a context_only answer's disaggregated_params at the top level
	// instead of in choices[0] (TensorRT-LLM's own place).
	TRTParamsTopLevel bool `json:"trt_params_top_level"`
	// TRTServerInfo, when set, is served verbatim by GET /server_info (TensorRT-LLM).
	TRTServerInfo string `json:"trt_server_info"`
	// KVLoadFailurePolicy is what a vLLM decode leg does when it cannot pull its KV (other
	// engines ignore it), as vLLM's
	// kv_load_failure_policy: "recompute" computes the prompt itself and answers 200; "fail"
	// (or "", the simulator's default, so contract errors surface) answers the error.
	KVLoadFailurePolicy string `json:"kv_load_failure_policy"`
	// KVFormat names the KV cache layout the pod produces and accepts, as a revision's engine
	// build and connector settings fix it; "" is a format like any other. A vLLM prefill leg
	// announces a set format in its kv_transfer_params (FieldKVFormat), as real KV connectors
	// carry engine and layout metadata; a decode leg whose own format differs cannot load the
	// KV: it behaves as for any failed KV load (KVLoadFailurePolicy). An SGLang decode leg of
	// another format is refused at the prefill pod's bootstrap server (the transfer fails).
	KVFormat string `json:"kv_format"`
	// RecordLimit bounds the request recorder; default 1024.
	RecordLimit int          `json:"record_limit"`
	Logger      *slog.Logger `json:"-"`
}

// Server is a running simulated pod.
type Server struct {
	cfg      PodConfig
	p        Params
	scale    float64
	eng      *engine
	contract contract
	rec      *recorder
	met      *podMetrics
	table    *kvTable
	aborts   *abortSet
	client   *http.Client
	log      *slog.Logger

	ln, kvLn    net.Listener
	srv, kvSrv  *http.Server
	faults      atomic.Pointer[Faults]
	serverInfo  atomic.Pointer[string]
	engineID    string
	deadKVPort  int // a port nothing listens on (Faults.WrongKVPort)
	seq         atomic.Int64
	blockSeq    atomic.Int64
	closeOnce   sync.Once
	done        chan struct{}
	crashedOnce sync.Once
	crashed     chan struct{}
}

// Start validates cfg, binds both listeners and serves until Close or ctx ends.
func Start(ctx context.Context, cfg PodConfig) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Params == (Params{}) {
		cfg.Params = DefaultParams()
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.KVAddr == "" {
		cfg.KVAddr = "127.0.0.1:0"
	}
	if cfg.RecordLimit == 0 {
		cfg.RecordLimit = 1024
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("sim pod %q: listen on addr %s: %w", cfg.Name, cfg.Addr, err)
	}
	kvLn, err := net.Listen("tcp", cfg.KVAddr)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("sim pod %q: listen on kv_addr %s: %w", cfg.Name, cfg.KVAddr, err)
	}
	if cfg.Name == "" {
		role := cfg.Role
		if role == "" {
			role = "standard"
		}
		cfg.Name = fmt.Sprintf("%s-%s-%d", cfg.Engine, role, ln.Addr().(*net.TCPAddr).Port)
	}
	dead := 1 // reserved, never listened on
	if dl, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		dead = dl.Addr().(*net.TCPAddr).Port
		dl.Close()
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Server{
		cfg: cfg, p: cfg.Params, scale: cfg.TimeScale,
		rec:        newRecorder(cfg.RecordLimit),
		table:      newKVTable(),
		aborts:     newAbortSet(),
		client:     &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}},
		log:        cfg.Logger,
		ln:         ln,
		kvLn:       kvLn,
		engineID:   cfg.Name + "-" + hex.EncodeToString(id[:]),
		deadKVPort: dead,
		done:       make(chan struct{}),
		crashed:    make(chan struct{}),
	}
	s.eng = newEngine(cfg.Params, cfg.TimeScale, s.done)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	f := cfg.Faults
	s.faults.Store(&f)
	if cfg.TRTServerInfo != "" {
		info := cfg.TRTServerInfo
		s.serverInfo.Store(&info)
	}
	switch cfg.Engine {
	case EngineVLLM:
		s.contract = vllmContract{}
	case EngineSGLang:
		s.contract = sglangContract{}
	case EngineTRTLLM:
		s.contract = trtContract{}
	}
	s.met = newPodMetrics(s)
	s.srv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	s.kvSrv = &http.Server{Handler: s.kvRoutes(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	go func() { _ = s.kvSrv.Serve(kvLn) }()
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	return s, nil
}

func (c *PodConfig) validate() error {
	switch c.Engine {
	case EngineVLLM, EngineSGLang, EngineTRTLLM:
	default:
		return fmt.Errorf("sim pod %q: engine %q: must be %s, %s or %s", c.Name, c.Engine, EngineVLLM, EngineSGLang, EngineTRTLLM)
	}
	switch c.Role {
	case RolePrefill, RoleDecode, RoleStandard:
	default:
		return fmt.Errorf("sim pod %q: role %q: must be prefill, decode or empty (standard)", c.Name, c.Role)
	}
	if c.Model == "" {
		return fmt.Errorf("sim pod %q: model is empty: name the model the pod serves", c.Name)
	}
	if c.TimeScale < 0 {
		return fmt.Errorf("sim pod %q: time_scale %v: must be ≥ 0", c.Name, c.TimeScale)
	}
	if c.RoutingSidecar && c.Engine != EngineVLLM {
		return fmt.Errorf("sim pod %q: routing_sidecar: only the vLLM (NIXL v2) sidecar protocol is simulated, engine is %s", c.Name, c.Engine)
	}
	if c.Params != (Params{}) {
		if err := c.Params.validate(); err != nil {
			return fmt.Errorf("sim pod %q: %w", c.Name, err)
		}
	}
	switch c.KVLoadFailurePolicy {
	case "", KVLoadFail, KVLoadRecompute:
	default:
		return fmt.Errorf("sim pod %q: kv_load_failure_policy %q: must be %s or %s", c.Name, c.KVLoadFailurePolicy, KVLoadRecompute, KVLoadFail)
	}
	if c.TRTServerInfo != "" && !json.Valid([]byte(c.TRTServerInfo)) {
		return fmt.Errorf("sim pod %q: trt_server_info is not valid JSON", c.Name)
	}
	return c.Faults.validate()
}

func (p Params) validate() error {
	for name, v := range map[string]float64{
		"prefill_base_seconds": p.PrefillBase, "prefill_per_token_seconds": p.PrefillPerToken,
		"prefill_quadratic_seconds": p.PrefillQuadratic, "decode_base_seconds": p.DecodeBase,
		"decode_per_seq_seconds": p.DecodePerSeq, "decode_per_kv_token_seconds": p.DecodePerKVToken, "transfer_base_seconds": p.TransferBase,
		"transfer_per_token_seconds": p.TransferPerToken, "kv_hold_seconds": p.KVHold,
		"bootstrap_timeout_seconds": p.BootstrapTimeout,
	} {
		if v < 0 {
			return fmt.Errorf("params.%s %v: must be ≥ 0", name, v)
		}
	}
	switch {
	case p.MaxRunning < 1:
		return fmt.Errorf("params.max_running %d: must be ≥ 1", p.MaxRunning)
	case p.PrefillLanes < 0:
		return fmt.Errorf("params.prefill_lanes %d: must be ≥ 0 (0: as many prompts per iteration as the token budget fits)", p.PrefillLanes)
	case p.MaxBatchedTokens < 0:
		return fmt.Errorf("params.max_batched_tokens %d: must be ≥ 0 (0: no per-iteration budget)", p.MaxBatchedTokens)
	case p.BlockSize < 1:
		return fmt.Errorf("params.block_size %d: must be ≥ 1", p.BlockSize)
	case p.KVTokens < p.BlockSize:
		return fmt.Errorf("params.kv_tokens %d: must be ≥ block_size (%d)", p.KVTokens, p.BlockSize)
	case p.DefaultMaxTokens < 1:
		return fmt.Errorf("params.default_max_tokens %d: must be ≥ 1", p.DefaultMaxTokens)
	}
	return nil
}

// URL is the pod's base URL, e.g. http://127.0.0.1:40123.
func (s *Server) URL() string { return "http://" + s.HostPort() }

// HostPort is the serving address, as an endpoint's host:port.
func (s *Server) HostPort() string { return s.ln.Addr().String() }

// KVHostPort is the KV side channel's address (vLLM remote_host:remote_port, SGLang bootstrap).
func (s *Server) KVHostPort() string { return s.kvLn.Addr().String() }

// BootstrapPort is the SGLang bootstrap port to announce (model.aibrix.ai/sglang-bootstrap-port).
func (s *Server) BootstrapPort() int { return s.kvLn.Addr().(*net.TCPAddr).Port }

// Config is the pod's configuration after defaults.
func (s *Server) Config() PodConfig { return s.cfg }

// EngineID is the vLLM engine id the pod returns as remote_engine_id.
func (s *Server) EngineID() string { return s.engineID }

// Stats is a snapshot of the pod's scheduler.
func (s *Server) Stats() Stats { return s.eng.stats() }

// WaitStats blocks until cond holds for the pod's scheduler state, or ctx ends.
func (s *Server) WaitStats(ctx context.Context, cond func(Stats) bool) (Stats, error) {
	for {
		ch := s.eng.watch()
		st := s.eng.stats()
		if cond(st) {
			return st, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return st, fmt.Errorf("sim pod %s: state never matched (last %+v): %w", s.cfg.Name, st, ctx.Err())
		}
	}
}

// Faults returns the pod's current faults.
func (s *Server) Faults() Faults { return *s.faults.Load() }

// SetFaults replaces the pod's faults.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	s.faults.Store(&f)
	return nil
}

// SetTRTServerInfo replaces what GET /server_info answers ("" restores the default).
func (s *Server) SetTRTServerInfo(raw string) error {
	if raw != "" && !json.Valid([]byte(raw)) {
		return fmt.Errorf("server_info is not valid JSON")
	}
	if raw == "" {
		s.serverInfo.Store(nil)
		return nil
	}
	s.serverInfo.Store(&raw)
	return nil
}

// Close stops the pod: both listeners and every open connection. Safe to call twice.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		_ = s.srv.Close()
		_ = s.kvSrv.Close()
		s.table.close()
		s.client.CloseIdleConnections()
	})
}

// Crash simulates a pod dying: like Close, and Crashed() fires.
func (s *Server) Crash() {
	s.crashedOnce.Do(func() { close(s.crashed) })
	s.Close()
}

// Crashed is closed once the pod has crashed (by Crash or POST /sim/crash).
func (s *Server) Crashed() <-chan struct{} { return s.crashed }

// Done is closed once the pod is closed.
func (s *Server) Done() <-chan struct{} { return s.done }

func (s *Server) served(model string) bool {
	if model == s.cfg.Model {
		return true
	}
	for _, m := range s.cfg.ExtraModels {
		if m == model {
			return true
		}
	}
	return false
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleInference)
	mux.HandleFunc("POST /v1/chat/completions", s.handleInference)
	mux.HandleFunc("POST /v1/messages", s.handleInference)
	mux.HandleFunc("POST /v1/responses", s.handleInference)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.met.mount(mux)
	switch s.cfg.Engine {
	case EngineSGLang:
		mux.HandleFunc("POST /abort_request", s.handleAbort)
	case EngineTRTLLM:
		mux.HandleFunc("GET /server_info", s.handleServerInfo)
	}
	mux.HandleFunc("GET /sim/requests", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, s.rec.list()) })
	mux.HandleFunc("DELETE /sim/requests", func(w http.ResponseWriter, _ *http.Request) { s.rec.reset(); w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /sim/faults", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, s.Faults()) })
	mux.HandleFunc("POST /sim/faults", s.handleSetFaults)
	mux.HandleFunc("DELETE /sim/faults", func(w http.ResponseWriter, _ *http.Request) {
		_ = s.SetFaults(Faults{})
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /sim/crash", func(w http.ResponseWriter, _ *http.Request) {
		// An explicit empty length makes the flushed headers the whole answer, so the
		// crash that follows cannot cut it short (a chunked body would end unterminated).
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusAccepted)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		go s.Crash()
	})
	mux.HandleFunc("GET /sim/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, s.Stats()) })
	mux.HandleFunc("POST /sim/server_info", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err := s.SetTRTServerInfo(strings.TrimSpace(string(b))); err != nil {
			writeError(w, badRequest("", "%v", err))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return s.record(mux)
}

// record keeps every request except the simulator's own control and scrape paths.
func (s *Server) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if strings.HasPrefix(p, "/sim/") || p == "/health" || p == "/metrics" || p == "/prometheus/metrics" {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		if err != nil {
			writeError(w, badRequest("", "reading the body: %v", err))
			return
		}
		s.rec.add(r, body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

const maxBodyBytes = 32 << 20

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	owner := map[string]string{EngineVLLM: "vllm", EngineSGLang: "sglang", EngineTRTLLM: "tensorrt_llm"}[s.cfg.Engine]
	data := []any{}
	for _, m := range append([]string{s.cfg.Model}, s.cfg.ExtraModels...) {
		data = append(data, map[string]any{"id": m, "object": "model", "created": 0, "owned_by": owner, "root": s.cfg.Model, "max_model_len": s.p.KVTokens})
	}
	writeJSON(w, 200, map[string]any{"object": "list", "data": data})
}

func (s *Server) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeError(w, badRequest("", "faults: %v (fields: error_rate, error_status, hang_before_first_token, hang_after_tokens, slow_start_seconds, pull_delay_seconds, recompute_kv, wrong_kv_port)", err))
		return
	}
	if err := s.SetFaults(f); err != nil {
		writeError(w, badRequest("", "%v", err))
		return
	}
	writeJSON(w, 200, f)
}

// handleInference serves /v1/completions, /v1/chat/completions, /v1/messages and /v1/responses.
func (s *Server) handleInference(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Sim-Pod", s.cfg.Name) // on refusals too: a 400 from a pod is told from Tandem's
	body, _ := io.ReadAll(r.Body)           // already bounded and buffered by record
	s.serveInference(w, r, body, true)
}

func (s *Server) serveInference(w http.ResponseWriter, r *http.Request, body []byte, sidecar bool) {
	ctx := r.Context()
	f, herr := s.faultsFor(r.Header)
	if herr != nil {
		writeError(w, herr)
		return
	}
	if f.SlowStart > 0 && !sleepWall(ctx, time.Duration(f.SlowStart*float64(time.Second))) {
		return
	}
	if f.fails() {
		writeError(w, &httpError{status: f.status(), typ: "sim_fault", msg: fmt.Sprintf("simulated fault on pod %s: status %d", s.cfg.Name, f.status())})
		return
	}
	q, herr := parseInference(r.URL.Path, body, s.p)
	if herr != nil {
		writeError(w, herr)
		return
	}
	if !s.served(q.model) {
		writeError(w, &httpError{status: http.StatusNotFound, typ: "NotFoundError", param: "model", msg: fmt.Sprintf("The model `%s` does not exist.", q.model)})
		return
	}
	if sidecar && s.cfg.RoutingSidecar && r.Header.Get(HeaderPrefiller) != "" {
		s.runSidecar(w, r, q, f)
		return
	}
	s.serveParsed(w, r, q, f)
}

// serveParsed classifies a parsed request under the engine's contract and serves it.
func (s *Server) serveParsed(w http.ResponseWriter, r *http.Request, q *inferReq, f Faults) {
	q.wrongKVPort = f.WrongKVPort && (s.cfg.Role == RolePrefill || s.cfg.AnyRole)
	lg, herr := s.contract.classify(s, q)
	if herr != nil {
		writeError(w, herr)
		return
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	if q.rid != "" {
		defer s.aborts.add(q.rid, cancel)()
	}
	s.run(ctx, w, q, lg, f)
}

// checkRole rejects a leg sent to a pod of the wrong role.
func (s *Server) checkRole(want, leg, engine string) *httpError {
	if s.cfg.AnyRole || s.cfg.Role == want {
		return nil
	}
	role := s.cfg.Role
	if role == "" {
		role = "standard"
	}
	return badRequest("", "%s: a %s leg was sent to pod %s whose role is %s; send it to a %s pod", engine, leg, s.cfg.Name, role, want)
}

func sleepWall(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *Server) nextID(prefix string) string {
	return prefix + strconv.FormatInt(s.seq.Add(1), 16) + "-" + s.cfg.Name
}

var errAborted = errors.New("request aborted by /abort_request")
