package sim

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// trtContract is TensorRT-LLM's disaggregated_params contract: a context_only leg on a
// context worker, then a generation_only leg on a generation worker carrying the context's
// disaggregated_params (context_first), or both at once sharing an id with schedule_style 1
// and the context worker's ctx_info_endpoint (generation_first).
type trtContract struct{}

// TRTMinRequestID is the smallest global disagg_request_id; TensorRT-LLM treats smaller ids as local.
const TRTMinRequestID = int64(1) << 42

var trtContextKeys = []string{"request_type", "disagg_request_id", "schedule_style"}

func (trtContract) classify(s *Server, q *inferReq) (*leg, *httpError) {
	raw, has := q.raw["disaggregated_params"]
	if !has {
		if s.cfg.Role != RoleStandard && !s.cfg.AnyRole {
			want := map[string]string{RolePrefill: "context_only", RoleDecode: "generation_only"}[s.cfg.Role]
			return nil, badRequest("disaggregated_params", "TensorRT-LLM %s worker %s needs disaggregated_params with request_type %q", s.cfg.Role, s.cfg.Name, want)
		}
		return &leg{kind: legPlain}, nil
	}
	dp, ok := raw.(map[string]any)
	if !ok {
		return nil, badRequest("disaggregated_params", "\"disaggregated_params\" must be an object, got %s", describe(raw))
	}
	id, present, err := intField(dp, "disagg_request_id")
	if err != nil || !present || id < TRTMinRequestID {
		return nil, badRequest("disaggregated_params.disagg_request_id", "disaggregated_params.disagg_request_id must be an integer ≥ 2^42 (%d; smaller ids are TensorRT-LLM local ids), got %s", TRTMinRequestID, describeKey(dp, "disagg_request_id"))
	}
	style, present, err := intField(dp, "schedule_style")
	if present && (err != nil || style != 1) {
		return nil, badRequest("disaggregated_params.schedule_style", "disaggregated_params.schedule_style must be 1 (generation_first) or absent, got %s", describe(dp["schedule_style"]))
	}
	switch rt := dp["request_type"]; rt {
	case "context_only":
		if herr := s.checkRole(RolePrefill, "context_only", "TensorRT-LLM"); herr != nil {
			return nil, herr
		}
		for k := range dp {
			if !slices.Contains(trtContextKeys, k) {
				return nil, badRequest("disaggregated_params."+k, "a context_only leg's disaggregated_params carries only %s; %q belongs elsewhere", strings.Join(trtContextKeys, ", "), k)
			}
		}
		if herr := prefillShape(q, "TensorRT-LLM"); herr != nil {
			return nil, herr
		}
		return trtContextLeg(s, q, id, present), nil
	case "generation_only":
		if herr := s.checkRole(RoleDecode, "generation_only", "TensorRT-LLM"); herr != nil {
			return nil, herr
		}
		return trtGenerationLeg(s, q, dp, id, present)
	default:
		return nil, badRequest("disaggregated_params.request_type", "disaggregated_params.request_type must be \"context_only\" or \"generation_only\", got %s", describe(rt))
	}
}

// trtHold is a context worker's finished context, kept for the generation leg.
type trtHold struct {
	hash   uint64
	tokens int
	first  int64
	opaque string
	free   func()
}

// trtOpaque is what the simulator packs into encoded_opaque_state: where the context lives.
type trtOpaque struct {
	KV string `json:"kv"`
	ID int64  `json:"id"`
}

func trtKey(id int64) string { return fmt.Sprintf("trt/%d", id) }

// trtContextLeg answers the context_only leg. With generation_first (schedule_style 1) the
// generation leg already waits at this worker for the context, so the context is handed to it
// only after this leg's answer is written: the worker returns its response and then the KV
// moves, and a short generation cannot finish before the gateway has read the context answer.
func trtContextLeg(s *Server, q *inferReq, id int64, genFirst bool) *leg {
	lg := &leg{kind: legPrefill}
	lg.handOff = func(_ context.Context, free func()) (extra, *httpError) {
		first, _ := outputToken(q.hash, 0)
		ob, _ := json.Marshal(trtOpaque{KV: s.KVHostPort(), ID: id})
		opaque := base64.StdEncoding.EncodeToString(ob)
		h := &trtHold{hash: q.hash, tokens: len(q.ids), first: first, opaque: opaque, free: free}
		dup := badRequest("disaggregated_params.disagg_request_id", "disagg_request_id %d already has a context on worker %s; ids must be unique", id, s.cfg.Name)
		hold := func() error { return s.table.put(trtKey(id), h, Wall(s.p.KVHold, s.scale), free) }
		if genFirst {
			if !s.table.vacant(trtKey(id)) {
				free()
				return extra{}, dup
			}
			lg.afterAnswer = func() {
				if hold() != nil {
					free()
				}
			}
		} else if hold() != nil {
			free()
			return extra{}, dup
		}
		dp := map[string]any{"request_type": "context_only", "first_gen_tokens": []int64{first}, "ctx_request_id": id,
			"encoded_opaque_state": opaque, "draft_tokens": nil, "disagg_request_id": id}
		x := extra{top: map[string]any{"prompt_token_ids": q.ids}}
		if s.cfg.TRTParamsTopLevel {
			x.top["disaggregated_params"] = dp
		} else {
			x.choice = map[string]any{"disaggregated_params": dp}
		}
		return x, nil
	}
	return lg
}

type trtPull struct {
	ID         int64   `json:"id"`
	PromptHash uint64  `json:"prompt_hash"`
	First      []int64 `json:"first_gen_tokens,omitempty"`
	Opaque     string  `json:"opaque,omitempty"`
	DPRank     int64   `json:"dp_rank"`
	Wait       bool    `json:"wait"` // generation_first: the context leg may not have arrived yet
}

func trtGenerationLeg(s *Server, q *inferReq, dp map[string]any, id int64, genFirst bool) (*leg, *httpError) {
	const f = "disaggregated_params."
	ctxID, present, err := intField(dp, "ctx_request_id")
	if err != nil || !present || ctxID != id {
		return nil, badRequest(f+"ctx_request_id", "disaggregated_params.ctx_request_id must equal disagg_request_id %d, got %s", id, describeKey(dp, "ctx_request_id"))
	}
	pull := trtPull{ID: id, PromptHash: q.hash}
	var addr string
	if op, ok := dp["encoded_opaque_state"]; ok || !genFirst {
		str, isStr := op.(string)
		var o trtOpaque
		b, err := base64.StdEncoding.DecodeString(str)
		if !isStr || err != nil || json.Unmarshal(b, &o) != nil || o.KV == "" {
			return nil, badRequest(f+"encoded_opaque_state", "disaggregated_params.encoded_opaque_state must be the context leg's value unchanged, got %s", describeKey(dp, "encoded_opaque_state"))
		}
		if o.ID != id {
			return nil, badRequest(f+"encoded_opaque_state", "disaggregated_params.encoded_opaque_state belongs to request %d, not disagg_request_id %d", o.ID, id)
		}
		pull.Opaque, addr = str, o.KV
	}
	if genFirst {
		ep, err := trtEndpoint(dp["ctx_info_endpoint"])
		if err != nil {
			return nil, badRequest(f+"ctx_info_endpoint", "disaggregated_params.ctx_info_endpoint %v, got %s", err, describeKey(dp, "ctx_info_endpoint"))
		}
		rank, present, err := intField(dp, "ctx_dp_rank")
		if err != nil || !present || rank < 0 {
			return nil, badRequest(f+"ctx_dp_rank", "disaggregated_params.ctx_dp_rank must be an integer ≥ 0 from /server_info, got %s", describeKey(dp, "ctx_dp_rank"))
		}
		addr, pull.DPRank, pull.Wait = ep, rank, true
	} else {
		first, err := intList(dp["first_gen_tokens"])
		if err != nil || len(first) == 0 {
			return nil, badRequest(f+"first_gen_tokens", "disaggregated_params.first_gen_tokens must be the context leg's integer array unchanged, got %s", describeKey(dp, "first_gen_tokens"))
		}
		pull.First = first
	}
	field := f + "encoded_opaque_state"
	if genFirst {
		field = f + "ctx_info_endpoint"
	}
	return &leg{kind: legDecode, pull: func(ctx context.Context) (int, *httpError) {
		return s.callKV(ctx, addr, "/sim/kv/trt/pull", field, pull)
	}}, nil
}

// trtEndpoint reads ctx_info_endpoint: "tcp://host:port", or a list holding exactly one.
func trtEndpoint(v any) (string, error) {
	if list, ok := v.([]any); ok {
		if len(list) != 1 {
			return "", errors.New("must be one endpoint")
		}
		v = list[0]
	}
	str, ok := v.(string)
	hp, found := strings.CutPrefix(str, "tcp://")
	if !ok || !found || hp == "" {
		return "", errors.New("must be \"tcp://host:port\" from the context worker's /server_info")
	}
	return hp, nil
}

// handleTRTPull runs on the context worker: hand the context to its generation leg.
func (s *Server) handleTRTPull(w http.ResponseWriter, r *http.Request) {
	dec := json.NewDecoder(r.Body)
	var p trtPull
	if err := dec.Decode(&p); err != nil {
		kvFail(w, http.StatusBadRequest, "bad pull request: %v", err)
		return
	}
	if p.Wait && p.DPRank != 0 {
		kvFail(w, http.StatusBadRequest, "disaggregated_params.ctx_dp_rank %d: context worker %s has attention DP rank 0 only", p.DPRank, s.cfg.Name)
		return
	}
	wait := Wall(s.p.BootstrapTimeout, s.scale)
	if !p.Wait {
		wait = 0
	}
	v, err := s.table.take(r.Context(), trtKey(p.ID), wait)
	switch {
	case errors.Is(err, errSlotTimeout):
		kvFail(w, http.StatusInternalServerError, "disagg_request_id %d: no context leg arrived at worker %s within %gs", p.ID, s.cfg.Name, s.p.BootstrapTimeout)
		return
	case errors.Is(err, errSlotTaken):
		kvFail(w, http.StatusBadRequest, "disagg_request_id %d already has a generation leg waiting", p.ID)
		return
	case err != nil:
		kvFail(w, http.StatusBadRequest, "disagg_request_id %d has no context on worker %s (no context_only leg ran there, it was consumed, or it expired)", p.ID, s.cfg.Name)
		return
	}
	h := v.(*trtHold)
	h.free()
	switch {
	case h.hash != p.PromptHash:
		kvFail(w, http.StatusBadRequest, "disagg_request_id %d: the generation leg's prompt differs from the context leg's (send prompt_token_ids unchanged)", p.ID)
	case p.First != nil && !slices.Equal(p.First, []int64{h.first}):
		kvFail(w, http.StatusBadRequest, "disaggregated_params.first_gen_tokens %v differ from the context leg's [%d]", p.First, h.first)
	case p.Opaque != "" && p.Opaque != h.opaque:
		kvFail(w, http.StatusBadRequest, "disaggregated_params.encoded_opaque_state differs from the context leg's")
	default:
		writeJSON(w, http.StatusOK, kvReply{Tokens: h.tokens})
	}
}

// handleServerInfo is TensorRT-LLM's /server_info, which generation_first reads.
func (s *Server) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	if raw := s.serverInfo.Load(); raw != nil {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(*raw))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"disaggregated_params": map[string]any{"ctx_info_endpoint": "tcp://" + s.KVHostPort(), "ctx_dp_rank": 0}})
}
