package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
)

// sglangContract is SGLang's bootstrap contract: both legs carry bootstrap_host,
// bootstrap_port, bootstrap_room and rid; the prefill leg waits at its bootstrap server until
// the decode leg with the same room joins, then computes and hands the KV over.
type sglangContract struct{}

func (sglangContract) classify(s *Server, q *inferReq) (*leg, *httpError) {
	if q.api == apiMessages {
		// SGLang's /v1/messages builds a new chat request from the Anthropic fields alone: the
		// bootstrap fields and rid never reach its engine.
		for _, k := range []string{"bootstrap_host", "bootstrap_port", "bootstrap_room", "rid"} {
			delete(q.raw, k)
		}
		q.rid = ""
	}
	_, h := q.raw["bootstrap_host"]
	_, p := q.raw["bootstrap_port"]
	_, r := q.raw["bootstrap_room"]
	if !h && !p && !r {
		if s.cfg.Role != RoleStandard && !s.cfg.AnyRole {
			return nil, badRequest("bootstrap_room", "SGLang pod %s runs with --disaggregation-mode %s and needs bootstrap_host, bootstrap_port and bootstrap_room", s.cfg.Name, s.cfg.Role)
		}
		return &leg{kind: legPlain}, nil
	}
	host, ok := q.raw["bootstrap_host"].(string)
	if !ok || host == "" {
		return nil, badRequest("bootstrap_host", "\"bootstrap_host\" must be the prefill pod's host, got %s", describeKey(q.raw, "bootstrap_host"))
	}
	port, present, err := intField(q.raw, "bootstrap_port")
	if err != nil || !present || port < 1 || port > 65535 {
		return nil, badRequest("bootstrap_port", "\"bootstrap_port\" must be an integer port 1–65535, got %s", describeKey(q.raw, "bootstrap_port"))
	}
	room, present, err := intField(q.raw, "bootstrap_room")
	if err != nil || !present || room < 0 {
		return nil, badRequest("bootstrap_room", "\"bootstrap_room\" must be an integer ≥ 0, got %s", describeKey(q.raw, "bootstrap_room"))
	}
	if q.rid == "" {
		return nil, badRequest("rid", "an SGLang PD leg must carry \"rid\", the same on both legs (/abort_request matches it)")
	}
	addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
	own := addr == s.KVHostPort()
	prefill := s.cfg.Role == RolePrefill || (s.cfg.AnyRole && own)
	switch {
	case s.cfg.Role == RoleStandard && !s.cfg.AnyRole:
		return nil, badRequest("bootstrap_room", "SGLang pod %s is a standard pod (no --disaggregation-mode): send it no bootstrap fields", s.cfg.Name)
	case prefill && !own:
		return nil, badRequest("bootstrap_port", "bootstrap_host:bootstrap_port %s is not this prefill pod's bootstrap server %s", addr, s.KVHostPort())
	case prefill:
		if herr := prefillShape(q, "SGLang"); herr != nil {
			return nil, herr
		}
		return sglangPrefillLeg(s, q, room), nil
	}
	join := sglangJoin{Room: room, RID: q.rid, PromptHash: q.hash, KVFormat: s.cfg.KVFormat}
	return &leg{kind: legDecode,
		arrive: func(ctx context.Context) *httpError {
			_, herr := s.callKV(ctx, addr, "/sim/kv/sglang/join", "bootstrap_host", join)
			return herr
		},
		pull: func(ctx context.Context) (int, *httpError) {
			return s.callKV(ctx, addr, "/sim/kv/sglang/pull", "bootstrap_host", join)
		}}, nil
}

// sglangJoin is a decode leg joining its room at the prefill pod's bootstrap server (on
// arrival, as SGLang's bootstrap handshake), then pulling the room's KV (once its KV blocks are
// allocated on the decode pod).
type sglangJoin struct {
	Room       int64  `json:"room"`
	RID        string `json:"rid"`
	PromptHash uint64 `json:"prompt_hash"`
	KVFormat   string `json:"kv_format"` // the decode pod's (PodConfig.KVFormat)
}

// sglangKV is what the prefill leg leaves for the decode leg: its KV, or why there is none.
type sglangKV struct {
	tokens int
	free   func()
	err    *httpError
}

func sglangDecodeKey(room int64) string { return fmt.Sprintf("sglang/decode/%d", room) }
func sglangKVKey(room int64) string     { return fmt.Sprintf("sglang/kv/%d", room) }

func sglangPrefillLeg(s *Server, q *inferReq, room int64) *leg {
	timeout := Wall(s.p.BootstrapTimeout, s.scale)
	return &leg{
		kind: legPrefill,
		beforeAdmit: func(ctx context.Context) *httpError {
			v, err := s.table.take(ctx, sglangDecodeKey(room), timeout)
			switch {
			case errors.Is(err, errSlotTaken):
				return badRequest("bootstrap_room", "bootstrap_room %d already has a prefill leg waiting on pod %s", room, s.cfg.Name)
			case errors.Is(err, errSlotTimeout):
				return &httpError{status: http.StatusInternalServerError, typ: "bootstrap_timeout", param: "bootstrap_room",
					msg: fmt.Sprintf("bootstrap_room %d: no decode leg joined within the bootstrap timeout (%gs)", room, s.p.BootstrapTimeout)}
			case err != nil:
				return nil // the request ended; run reports why
			}
			j := v.(sglangJoin)
			var herr *httpError
			switch {
			case j.RID != q.rid:
				herr = badRequest("rid", "bootstrap_room %d: the decode leg's rid %q differs from the prefill leg's %q; use one rid on both legs", room, j.RID, q.rid)
			case j.PromptHash != q.hash:
				herr = badRequest("bootstrap_room", "bootstrap_room %d: the decode leg's prompt differs from the prefill leg's", room)
			case j.KVFormat != s.cfg.KVFormat:
				// SGLang has no fallback to a local prefill: the transfer fails on both legs.
				herr = &httpError{status: http.StatusInternalServerError, typ: "kv_transfer_error", param: "bootstrap_room",
					msg: fmt.Sprintf("bootstrap_room %d: the decode pod's KV format %s differs from prefill pod %s's %s: the KV cannot be transferred; pair pods of one revision",
						room, formatName(j.KVFormat), s.cfg.Name, formatName(s.cfg.KVFormat))}
			}
			if herr != nil {
				_ = s.table.put(sglangKVKey(room), sglangKV{err: herr}, timeout, nil)
			}
			return herr
		},
		handOff: func(ctx context.Context, free func()) (extra, *httpError) {
			// Until the decode leg pulls it, the held KV answers /abort_request with this rid.
			key := sglangKVKey(room)
			unregister := s.aborts.add(q.rid, func(error) {
				if v, err := s.table.take(context.Background(), key, 0); err == nil {
					v.(sglangKV).free()
				}
			})
			freed := make(chan struct{})
			var once sync.Once
			release := func() {
				once.Do(func() {
					free()
					unregister()
					close(freed)
				})
			}
			if err := s.table.put(key, sglangKV{tokens: len(q.ids), free: release}, Wall(s.p.KVHold, s.scale), release); err != nil {
				release()
				return extra{}, badRequest("bootstrap_room", "bootstrap_room %d is already in use", room)
			}
			// SGLang answers the prefill leg once its KV was sent: the decode leg pulled it, an
			// abort freed it, or the hold expired. A client that goes away stops waiting; the KV
			// stays held until one of those.
			select {
			case <-freed:
			case <-ctx.Done():
			}
			return extra{}, nil
		},
	}
}

// handleSGLangJoin runs on the prefill pod: the decode leg announces itself on arrival.
func (s *Server) handleSGLangJoin(w http.ResponseWriter, r *http.Request) {
	var j sglangJoin
	if err := json.NewDecoder(r.Body).Decode(&j); err != nil {
		kvFail(w, http.StatusBadRequest, "bad join request: %v", err)
		return
	}
	if err := s.table.put(sglangDecodeKey(j.Room), j, Wall(s.p.BootstrapTimeout, s.scale), nil); err != nil {
		kvFail(w, http.StatusBadRequest, "bootstrap_room %d already has a decode leg on bootstrap server %s", j.Room, s.KVHostPort())
		return
	}
	writeJSON(w, http.StatusOK, kvReply{})
}

// handleSGLangPull runs on the prefill pod: the decode leg, its KV blocks allocated, waits for
// the room's KV and takes it, which frees it here.
func (s *Server) handleSGLangPull(w http.ResponseWriter, r *http.Request) {
	var j sglangJoin
	if err := json.NewDecoder(r.Body).Decode(&j); err != nil {
		kvFail(w, http.StatusBadRequest, "bad pull request: %v", err)
		return
	}
	v, err := s.table.take(r.Context(), sglangKVKey(j.Room), Wall(s.p.BootstrapTimeout, s.scale))
	switch {
	case errors.Is(err, errSlotTimeout):
		kvFail(w, http.StatusInternalServerError, "bootstrap_room %d: no prefill leg delivered KV within the bootstrap timeout (%gs)", j.Room, s.p.BootstrapTimeout)
		return
	case err != nil:
		kvFail(w, http.StatusServiceUnavailable, "bootstrap_room %d: %v", j.Room, err)
		return
	}
	kv := v.(sglangKV)
	if kv.err != nil {
		kvFail(w, kv.err.status, "%s", kv.err.msg)
		return
	}
	kv.free()
	writeJSON(w, http.StatusOK, kvReply{Tokens: kv.tokens})
}

// handleAbort is SGLang's /abort_request: drop every waiting or running request whose rid
// starts with the given rid, and free the KV a finished prefill leg of such a rid still holds. It answers 200 whether or not anything matched, as SGLang does.
func (s *Server) handleAbort(w http.ResponseWriter, r *http.Request) {
	var req map[string]any
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, badRequest("rid", "/abort_request needs a JSON body {\"rid\": \"...\"}: %v", err))
		return
	}
	rid, ok := req["rid"].(string)
	if !ok {
		writeError(w, badRequest("rid", "/abort_request needs a string \"rid\", got %s", describeKey(req, "rid")))
		return
	}
	s.aborts.abort(rid)
	w.WriteHeader(http.StatusOK)
}
