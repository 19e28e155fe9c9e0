package sim

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"
)

// runSidecar does what the llm-d routing sidecar (NIXL v2 connector, v0.7.1) does in front of
// a vLLM decode pod: run the prefill leg against x-prefiller-host-port, then decode locally
// with the prefill's kv_transfer_params. A 4xx prefill answer is passed back; a 5xx or an
// unreachable prefill pod falls back to decoding the original request locally.
func (s *Server) runSidecar(w http.ResponseWriter, r *http.Request, q *inferReq, f Faults) {
	target := strings.TrimSpace(strings.Split(r.Header.Get(HeaderPrefiller), ",")[0])
	pre := maps.Clone(q.raw)
	pre["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	pre["stream"] = false
	delete(pre, "stream_options")
	pre["max_tokens"] = 1
	pre["max_completion_tokens"] = 1
	body, _ := json.Marshal(pre)
	var id [16]byte
	_, _ = rand.Read(id[:])
	reqID := hex.EncodeToString(id[:])

	hr, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://"+target+r.URL.Path, bytes.NewReader(body))
	if err != nil {
		writeError(w, badRequest("", "header %s %q is not a host:port: %v", HeaderPrefiller, target, err))
		return
	}
	hr.Header = r.Header.Clone()
	hr.Header.Del("Content-Length")
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Add("X-Request-Id", reqID)
	resp, err := s.client.Do(hr)
	var kv any
	switch {
	case err != nil && r.Context().Err() != nil:
		return
	case err != nil || resp.StatusCode >= 500:
		if resp != nil {
			resp.Body.Close()
		}
		s.log.Info("sidecar: prefill failed, decoding locally", "prefiller", target, "err", err)
		s.serveLocal(w, r, q.raw, f, "fallback")
		return
	case resp.StatusCode != http.StatusOK:
		defer resp.Body.Close()
		maps.Copy(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		return
	default:
		var pr map[string]any
		dec := json.NewDecoder(resp.Body)
		dec.UseNumber()
		err := dec.Decode(&pr)
		resp.Body.Close()
		if err != nil {
			writeError(w, &httpError{status: http.StatusBadGateway, typ: "sidecar_error", msg: "prefill answer is not JSON: " + err.Error()})
			return
		}
		kv = pr["kv_transfer_params"]
	}
	dec := maps.Clone(q.raw)
	dec["kv_transfer_params"] = kv
	s.serveLocal(w, r, dec, f, "decode")
}

// serveLocal serves a body the sidecar built, recording it with X-Sim-Sidecar-Leg.
func (s *Server) serveLocal(w http.ResponseWriter, r *http.Request, m map[string]any, f Faults, kind string) {
	body, _ := json.Marshal(m)
	h := r.Header.Clone()
	h.Set(HeaderSidecarLeg, kind)
	s.rec.addRecord(Recorded{Time: time.Now(), Method: r.Method, Path: r.URL.RequestURI(), Header: h, Body: body, Text: string(body)})
	q, herr := parseInference(r.URL.Path, body, s.p)
	if herr != nil {
		writeError(w, herr)
		return
	}
	s.serveParsed(w, r, q, f)
}
