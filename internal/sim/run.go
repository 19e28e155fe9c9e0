package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

type legKind int

const (
	legPlain   legKind = iota // a whole request computed here
	legPrefill                // computes the KV, answers one token, hands the KV on
	legDecode                 // pulls the KV from a prefill pod, then decodes
)

// contract is one engine's PD wire contract.
type contract interface {
	// classify validates what a request carries and says which leg it is.
	classify(s *Server, q *inferReq) (*leg, *httpError)
}

// leg is how to serve one request under its engine's contract.
type leg struct {
	kind legKind
	// pull (decode legs) fetches the KV from the prefill pod and returns its token count.
	pull func(ctx context.Context) (int, *httpError)
	// beforeAdmit (prefill legs) waits for what must happen first (SGLang: the decode leg connects).
	beforeAdmit func(ctx context.Context) *httpError
	// arrive (decode legs), when set, announces the leg to its prefill pod on arrival, before
	// it waits for KV blocks here (SGLang's bootstrap handshake).
	arrive func(ctx context.Context) *httpError
	// handOff (prefill legs) keeps the computed KV for the decode leg, which frees it with
	// free, and returns what to add to the answer.
	handOff func(ctx context.Context, free func()) (extra, *httpError)
	// afterAnswer (prefill legs), when handOff sets it, runs once the answer is written.
	afterAnswer func()
}

// extra is what a prefill leg adds to its answer.
type extra struct {
	top    map[string]any // top-level keys
	choice map[string]any // keys of choices[0]
}

// run serves a classified request through the pod's scheduler (Batch, driven by the engine
// loop): an SGLang prefill leg first waits for its decode leg; a decode leg waits for KV
// blocks, pulls the KV from its prefill pod over the pod's inbound link, then decodes; every
// other leg queues, prefills in chunks and streams its tokens as the iterations produce them.
func (s *Server) run(ctx context.Context, w http.ResponseWriter, q *inferReq, lg *leg, f Faults) {
	out := q.maxTokens
	if lg.kind == legPrefill {
		out = 1
	}
	if need := len(q.ids) + out; need > s.p.KVTokens {
		writeError(w, badRequest("max_tokens", "prompt (%d tokens) plus output (%d tokens) exceed pod %s's KV capacity of %d tokens", len(q.ids), out, s.cfg.Name, s.p.KVTokens))
		return
	}
	if lg.kind == legDecode && f.RecomputeKV {
		// A broken KV connector: the transferred KV is never read; the prompt is computed here.
		lg = &leg{kind: legPlain}
	}
	if lg.kind == legDecode && s.cfg.Engine == EngineVLLM && s.cfg.KVLoadFailurePolicy == KVLoadRecompute {
		// vLLM's kv_load_failure_policy "recompute": a KV load that fails makes the decode pod
		// compute the prompt itself. The pull is made up front so its failure can turn the
		// leg into a local one.
		tokens, herr := lg.pull(ctx)
		switch {
		case ctx.Err() != nil:
			s.fail(ctx, w, nil)
			return
		case herr != nil:
			s.log.Info("KV load failed; recomputing the prompt (kv_load_failure_policy recompute)", "pod", s.cfg.Name, "error", herr.msg)
			lg = &leg{kind: legPlain}
		default:
			lg = &leg{kind: legDecode, pull: func(context.Context) (int, *httpError) { return tokens, nil }}
		}
	}
	arrived := time.Now()
	if lg.beforeAdmit != nil {
		s.eng.addQueue(1, 0)
		herr := lg.beforeAdmit(ctx)
		s.eng.addQueue(-1, 0)
		if herr != nil || ctx.Err() != nil { // refused, or aborted / abandoned while waiting
			s.fail(ctx, w, herr)
			return
		}
	}
	if lg.arrive != nil {
		if herr := lg.arrive(ctx); herr != nil || ctx.Err() != nil {
			s.fail(ctx, w, herr)
			return
		}
	}
	hashes := BlockHashes(q.ids, s.p.BlockSize)
	sq := &Seq{Kind: SeqWhole, Prompt: len(q.ids), Out: out, Hashes: hashes}
	switch lg.kind {
	case legPrefill:
		sq.Kind = SeqPrefill
	case legDecode:
		sq.Kind = SeqDecode
	}
	// A hang holds the sequence (slot and KV) after the prefill or after N tokens, unanswered.
	switch {
	case f.HangBeforeFirstToken:
		sq.PauseAfter = 1
	case f.HangAfterTokens > 0:
		sq.PauseAfter = f.HangAfterTokens + 1
	}
	h := s.eng.add(sq)
	defer h.cancel()
	a := &answer{s: s, w: w, q: q, id: s.nextID(idPrefix(q.api)), created: time.Now().Unix()}
	s.met.promptTokens.Add(int64(len(q.ids)))
	i := 0 // tokens emitted
	for {
		ev, ok := h.next(ctx)
		if !ok {
			if i > 0 || (f.HangBeforeFirstToken && q.stream && lg.kind != legPrefill) {
				a.interrupted(ctx)
			} else {
				s.fail(ctx, w, nil)
			}
			return
		}
		switch ev {
		case EvAllocated: // decode leg: KV blocks held here; pull the prompt's KV, then decode
			s.eng.addQueue(0, 1)
			var tokens int
			var herr *httpError
			if f.PullDelay <= 0 || sleepWall(ctx, time.Duration(f.PullDelay*float64(time.Second))) {
				tokens, herr = lg.pull(ctx)
			}
			var secs float64
			if herr == nil && ctx.Err() == nil {
				secs, ok = s.eng.transfer(ctx, tokens)
			}
			s.eng.addQueue(0, -1)
			if herr != nil || ctx.Err() != nil || !ok {
				s.fail(ctx, w, herr)
				return
			}
			a.queue, a.transfer = time.Since(arrived).Seconds()/s.scale-secs, secs
			if s.cfg.Engine == EngineVLLM {
				// vLLM counts the tokens its KV connector loaded among the prompt's cached
				// tokens (usage.prompt_tokens_details.cached_tokens), as it does prefix-cache hits.
				a.cached = tokens
			}
			s.eng.remember(hashes)
			h.ready()
		case EvScheduled:
			if lg.kind != legDecode {
				a.queue = time.Since(arrived).Seconds() / s.scale
				a.cached = h.cached()
				s.met.cacheQueries.Add(int64(len(q.ids)))
				s.met.cacheHits.Add(int64(a.cached))
			}
		case EvToken:
			if i == 0 {
				if lg.kind != legDecode {
					a.prefill = h.prefillSeconds()
					s.met.prefillTime.Observe(a.prefill)
				}
				if f.HangBeforeFirstToken {
					if q.stream && lg.kind != legPrefill {
						a.start()
					}
					<-ctx.Done()
					a.interrupted(ctx)
					return
				}
				s.met.ttft.Observe(time.Since(arrived).Seconds() / s.scale)
			}
			if f.HangAfterTokens > 0 && i == f.HangAfterTokens {
				<-ctx.Done()
				a.interrupted(ctx)
				return
			}
			if lg.kind == legPrefill {
				continue // answered at EvHeld
			}
			a.add(i)
			i++
			s.eng.generated()
		case EvHeld: // prefill leg: the KV stays until the decode leg pulls it
			x, herr := lg.handOff(ctx, h.release)
			if herr != nil {
				h.release()
				s.fail(ctx, w, herr)
				return
			}
			a.add(0)
			s.eng.generated()
			a.finish(x)
			if lg.afterAnswer != nil {
				if f, ok := w.(http.Flusher); ok {
					f.Flush()
				}
				lg.afterAnswer()
			}
			return
		case EvFinished:
			a.finish(extra{})
			return
		}
	}
}

// fail answers a failed request: herr if given, else why ctx ended (nothing if the client left).
func (s *Server) fail(ctx context.Context, w http.ResponseWriter, herr *httpError) {
	if herr != nil {
		writeError(w, herr)
		return
	}
	if errors.Is(context.Cause(ctx), errAborted) {
		writeError(w, &httpError{status: http.StatusInternalServerError, typ: "abort", msg: errAborted.Error()})
	}
}

// answer writes one response, streamed as SSE chunks or as one JSON object.
type answer struct {
	s       *Server
	w       http.ResponseWriter
	q       *inferReq
	id      string
	created int64
	started bool
	text    strings.Builder
	tokens  int
	// model seconds and tokens reported in X-Sim-* headers
	queue, prefill, transfer float64
	cached                   int
}

func (a *answer) headers() {
	h := a.w.Header()
	h.Set("X-Sim-Pod", a.s.cfg.Name)
	h.Set("X-Sim-Prompt-Tokens", strconv.Itoa(len(a.q.ids)))
	h.Set("X-Sim-Cached-Tokens", strconv.Itoa(a.cached))
	h.Set("X-Sim-Queue-Seconds", strconv.FormatFloat(a.queue, 'g', -1, 64))
	h.Set("X-Sim-Prefill-Seconds", strconv.FormatFloat(a.prefill, 'g', -1, 64))
	h.Set("X-Sim-Transfer-Seconds", strconv.FormatFloat(a.transfer, 'g', -1, 64))
}

// start sends the SSE headers, and nothing else: like vLLM, the first body chunk (chat's
// role chunk) waits for the first token.
func (a *answer) start() {
	if a.started {
		return
	}
	a.started = true
	a.headers()
	h := a.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	a.w.WriteHeader(http.StatusOK)
	if f, ok := a.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (a *answer) object() string {
	switch {
	case a.q.chat && a.q.stream:
		return "chat.completion.chunk"
	case a.q.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (a *answer) chunk(choice map[string]any) {
	c := map[string]any{"id": a.id, "object": a.object(), "created": a.created, "model": a.q.model, "choices": []any{choice}}
	if a.q.usage {
		c["usage"] = nil
	}
	a.event(c)
}

func (a *answer) event(v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(a.w, "data: %s\n\n", b)
	if f, ok := a.w.(http.Flusher); ok {
		f.Flush()
	}
}

// add emits output token i.
func (a *answer) add(i int) {
	_, tok := outputToken(a.q.hash, i)
	a.tokens++
	if !a.q.stream {
		a.text.WriteString(tok)
		return
	}
	if a.q.api == apiMessages || a.q.api == apiResponses {
		a.text.WriteString(tok)
		a.addEvent(tok)
		return
	}
	a.start()
	finish := any(nil)
	if a.tokens == a.q.maxTokens {
		finish = "length"
	}
	if a.q.chat {
		if a.tokens == 1 {
			a.chunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil})
		}
		a.chunk(map[string]any{"index": 0, "delta": map[string]any{"content": tok}, "logprobs": nil, "finish_reason": finish})
	} else {
		a.chunk(map[string]any{"index": 0, "text": tok, "logprobs": nil, "finish_reason": finish})
	}
}

func (a *answer) usage() map[string]any {
	u := map[string]any{"prompt_tokens": len(a.q.ids), "completion_tokens": a.tokens, "total_tokens": len(a.q.ids) + a.tokens}
	// vLLM (with --enable-prompt-tokens-details) leaves prompt_tokens_details out when no
	// prompt token was cached.
	if a.cached > 0 || a.s.cfg.Engine != EngineVLLM {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": a.cached}
	}
	return u
}

// finish ends the answer: the usage chunk and [DONE], or the JSON object with x added.
func (a *answer) finish(x extra) {
	if a.q.api == apiMessages || a.q.api == apiResponses {
		if a.q.stream {
			a.start()
			a.finishEvents()
		} else {
			a.finishJSON(x)
		}
		return
	}
	if a.q.stream {
		a.start()
		if a.q.usage {
			a.event(map[string]any{"id": a.id, "object": a.object(), "created": a.created, "model": a.q.model, "choices": []any{}, "usage": a.usage()})
		}
		fmt.Fprint(a.w, "data: [DONE]\n\n")
		return
	}
	var choice map[string]any
	if a.q.chat {
		choice = map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": a.text.String()}, "logprobs": nil, "finish_reason": "length"}
	} else {
		choice = map[string]any{"index": 0, "text": a.text.String(), "logprobs": nil, "finish_reason": "length", "stop_reason": nil}
	}
	for k, v := range x.choice {
		choice[k] = v
	}
	resp := map[string]any{"id": a.id, "object": a.object(), "created": a.created, "model": a.q.model, "choices": []any{choice}, "usage": a.usage()}
	for k, v := range x.top {
		resp[k] = v
	}
	a.headers()
	writeJSON(a.w, http.StatusOK, resp)
}

// interrupted ends an answer whose context ended: an aborted request says so, a departed
// client gets nothing.
func (a *answer) interrupted(ctx context.Context) {
	if !errors.Is(context.Cause(ctx), errAborted) {
		return
	}
	if !a.started {
		a.s.fail(ctx, a.w, nil)
		return
	}
	if a.q.api == apiMessages || a.q.api == apiResponses {
		a.interruptedEvents()
		return
	}
	if a.q.chat {
		a.chunk(map[string]any{"index": 0, "delta": map[string]any{}, "logprobs": nil, "finish_reason": "abort"})
	} else {
		a.chunk(map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": "abort"})
	}
	fmt.Fprint(a.w, "data: [DONE]\n\n")
}
