package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
)

// vllmContract is vLLM's NixlConnector contract (AIBrix "shfs", the llm-d sidecar's NIXL v2)
// and AIBrix's NIXL/Neuron variant, where the decode leg carries disagg_prefill_resp.
type vllmContract struct{}

func (vllmContract) classify(s *Server, q *inferReq) (*leg, *httpError) {
	kv := q.raw["kv_transfer_params"]
	resp, hasResp := q.raw["disagg_prefill_resp"]
	switch {
	case kv != nil && hasResp:
		return nil, badRequest("disagg_prefill_resp", "send kv_transfer_params or disagg_prefill_resp, not both")
	case hasResp:
		obj, ok := resp.(map[string]any)
		if !ok {
			return nil, badRequest("disagg_prefill_resp", "\"disagg_prefill_resp\" must be the prefill pod's whole JSON answer, got %s", describe(resp))
		}
		params, ok := obj["kv_transfer_params"].(map[string]any)
		if !ok {
			return nil, badRequest("disagg_prefill_resp.kv_transfer_params", "\"disagg_prefill_resp\" has no kv_transfer_params object: pass the prefill answer unchanged")
		}
		return vllmDecode(s, q, params, "disagg_prefill_resp.kv_transfer_params")
	case kv != nil:
		params, ok := kv.(map[string]any)
		if !ok {
			return nil, badRequest("kv_transfer_params", "\"kv_transfer_params\" must be an object, got %s", describe(kv))
		}
		switch {
		case params["do_remote_decode"] == true && params["do_remote_prefill"] == true:
			return nil, badRequest("kv_transfer_params", "kv_transfer_params sets both do_remote_decode and do_remote_prefill: a leg is either the prefill (do_remote_decode) or the decode (do_remote_prefill)")
		case params["do_remote_decode"] == true:
			return vllmPrefill(s, q, params)
		case params["do_remote_prefill"] == true:
			return vllmDecode(s, q, params, "kv_transfer_params")
		}
		return nil, badRequest("kv_transfer_params", "kv_transfer_params must set do_remote_decode: true (prefill leg) or do_remote_prefill: true (decode leg), got do_remote_decode=%s do_remote_prefill=%s",
			describeKey(params, "do_remote_decode"), describeKey(params, "do_remote_prefill"))
	}
	if s.cfg.Role == RolePrefill && !s.cfg.AnyRole {
		// AIBrix's NIXL variant sends the prefill leg without kv_transfer_params.
		if herr := prefillShape(q, "vLLM"); herr != nil {
			herr.msg = fmt.Sprintf("prefill pod %s got a request that is not a prefill leg: %s (a prefill leg carries kv_transfer_params.do_remote_decode: true)", s.cfg.Name, herr.msg)
			return nil, herr
		}
		return vllmPrefillLeg(s, q), nil
	}
	return &leg{kind: legPlain}, nil
}

func vllmPrefill(s *Server, q *inferReq, params map[string]any) (*leg, *httpError) {
	if herr := s.checkRole(RolePrefill, "prefill", "vLLM"); herr != nil {
		return nil, herr
	}
	if v, ok := params["do_remote_prefill"]; !ok || v != false {
		return nil, badRequest("kv_transfer_params.do_remote_prefill", "a prefill leg's kv_transfer_params.do_remote_prefill must be false, got %s", describeKey(params, "do_remote_prefill"))
	}
	for _, k := range []string{"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"} {
		if v, ok := params[k]; !ok || v != nil {
			return nil, badRequest("kv_transfer_params."+k, "a prefill leg's kv_transfer_params.%s must be present and null, got %s", k, describeKey(params, k))
		}
	}
	if herr := prefillShape(q, "vLLM"); herr != nil {
		return nil, herr
	}
	return vllmPrefillLeg(s, q), nil
}

// vllmHold is KV a prefill pod keeps for a decode leg.
type vllmHold struct {
	blocks []int64
	hash   uint64
	tokens int
	free   func()
}

func vllmPrefillLeg(s *Server, q *inferReq) *leg {
	return &leg{kind: legPrefill, handOff: func(_ context.Context, free func()) (extra, *httpError) {
		n := max(1, (len(q.ids)+s.p.BlockSize-1)/s.p.BlockSize)
		blocks := make([]int64, n)
		for i := range blocks {
			blocks[i] = s.blockSeq.Add(1)
		}
		h := &vllmHold{blocks: blocks, hash: q.hash, tokens: len(q.ids), free: free}
		if err := s.table.put(vllmKey(s.engineID, blocks[0]), h, Wall(s.p.KVHold, s.scale), free); err != nil {
			free()
			return extra{}, &httpError{status: http.StatusInternalServerError, typ: "kv_transfer_error", msg: "block id reused: " + err.Error()}
		}
		host, port, _ := net.SplitHostPort(s.KVHostPort())
		p, _ := strconv.Atoi(port)
		if q.wrongKVPort {
			p = s.deadKVPort
		}
		params := map[string]any{
			"do_remote_prefill": true, "do_remote_decode": false,
			"remote_engine_id": s.engineID, "remote_block_ids": blocks,
			"remote_host": host, "remote_port": p, "tp_size": 1,
		}
		if s.cfg.KVFormat != "" {
			params[FieldKVFormat] = s.cfg.KVFormat
		}
		return extra{top: map[string]any{"kv_transfer_params": params}}, nil
	}}
}

// FieldKVFormat is the simulator's own kv_transfer_params key in which a vLLM prefill leg
// announces its pod's KV format (PodConfig.KVFormat); absent means the format "".
const FieldKVFormat = "sim_kv_format"

func vllmKey(engine string, first int64) string { return fmt.Sprintf("vllm/%s/%d", engine, first) }

type vllmPull struct {
	EngineID   string  `json:"engine_id"`
	BlockIDs   []int64 `json:"block_ids"`
	PromptHash uint64  `json:"prompt_hash"`
}

func vllmDecode(s *Server, q *inferReq, params map[string]any, field string) (*leg, *httpError) {
	if herr := s.checkRole(RoleDecode, "decode", "vLLM"); herr != nil {
		return nil, herr
	}
	if v, ok := params["do_remote_decode"]; ok && v != false {
		return nil, badRequest(field+".do_remote_decode", "a decode leg's %s.do_remote_decode must be false, got %s", field, describe(v))
	}
	engineID, ok := params["remote_engine_id"].(string)
	if !ok || engineID == "" {
		return nil, badRequest(field+".remote_engine_id", "%s.remote_engine_id must be the non-empty string the prefill pod returned, got %s", field, describeKey(params, "remote_engine_id"))
	}
	blocks, err := intList(params["remote_block_ids"])
	if err != nil || len(blocks) == 0 {
		return nil, badRequest(field+".remote_block_ids", "%s.remote_block_ids must be the non-empty integer array the prefill pod returned, got %s", field, describeKey(params, "remote_block_ids"))
	}
	host, ok := params["remote_host"].(string)
	if !ok || host == "" {
		return nil, badRequest(field+".remote_host", "%s.remote_host must be the prefill pod's host, got %s", field, describeKey(params, "remote_host"))
	}
	port, present, err := intField(params, "remote_port")
	if err != nil || !present || port < 1 || port > 65535 {
		return nil, badRequest(field+".remote_port", "%s.remote_port must be an integer port 1–65535, got %s", field, describeKey(params, "remote_port"))
	}
	if tp, present, err := intField(params, "tp_size"); present && (err != nil || tp < 1) {
		return nil, badRequest(field+".tp_size", "%s.tp_size must be an integer ≥ 1, got %s", field, describe(params["tp_size"]))
	}
	format, present := params[FieldKVFormat]
	if present {
		if f, ok := format.(string); !ok || f == "" {
			return nil, badRequest(field+"."+FieldKVFormat, "%s.%s must be the non-empty string the prefill pod returned, got %s", field, FieldKVFormat, describe(format))
		}
	}
	announced, _ := format.(string)
	addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
	return &leg{kind: legDecode, pull: func(ctx context.Context) (int, *httpError) {
		if announced != s.cfg.KVFormat {
			// The KV cannot be read: the prefill pod keeps it until it expires, as after a
			// failed connector handshake.
			return 0, badRequest(field+"."+FieldKVFormat, "the prefill pod's KV format %s differs from decode pod %s's %s: the KV cannot be loaded; pair pods of one revision",
				formatName(announced), s.cfg.Name, formatName(s.cfg.KVFormat))
		}
		return s.callKV(ctx, addr, "/sim/kv/vllm/pull", field+".remote_host", vllmPull{EngineID: engineID, BlockIDs: blocks, PromptHash: q.hash})
	}}, nil
}

// handleVLLMPull hands held blocks to a decode leg (the NIXL read, in the simulator).
func (s *Server) handleVLLMPull(w http.ResponseWriter, r *http.Request) {
	var req vllmPull
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.BlockIDs) == 0 {
		kvFail(w, http.StatusBadRequest, "bad pull request: %v", err)
		return
	}
	if req.EngineID != s.engineID {
		kvFail(w, http.StatusBadRequest, "kv_transfer_params.remote_engine_id %q is unknown: the engine at %s is %q", req.EngineID, s.KVHostPort(), s.engineID)
		return
	}
	v, err := s.table.take(r.Context(), vllmKey(s.engineID, req.BlockIDs[0]), 0)
	if err != nil {
		kvFail(w, http.StatusBadRequest, "kv_transfer_params.remote_block_ids %v are not held by engine %s (never prefilled, already pulled, or expired after %gs)", req.BlockIDs, s.engineID, s.p.KVHold)
		return
	}
	h := v.(*vllmHold)
	h.free()
	switch {
	case !slices.Equal(h.blocks, req.BlockIDs):
		kvFail(w, http.StatusBadRequest, "kv_transfer_params.remote_block_ids %v differ from the blocks the prefill returned %v", req.BlockIDs, h.blocks)
	case h.hash != req.PromptHash:
		kvFail(w, http.StatusBadRequest, "the decode leg's prompt differs from the prompt prefilled into blocks %v", h.blocks)
	default:
		writeJSON(w, http.StatusOK, kvReply{Tokens: h.tokens})
	}
}

// formatName quotes a KV format for messages, naming the unset one.
func formatName(f string) string {
	if f == "" {
		return "(unset)"
	}
	return strconv.Quote(f)
}
