// Package proof judges, for each prefill/decode request, whether the decode pod used the KV its
// prefill leg computed (verified), computed the prompt again itself (recomputed), or cannot be
// told (unknown), from what the decode answer reports and when its first byte came; and it keeps
// the lenient policy's state: a decode pod whose transfers keep recomputing stops receiving
// work until a trial request verifies again.
//
// The evidence, per engine (docs/proof.md has the details): vLLM reports the prompt tokens its
// KV connector loaded among usage.prompt_tokens_details.cached_tokens, with
// --enable-prompt-tokens-details, in the JSON answer or, streamed, in the final usage chunk
// (stream_options.include_usage), and leaves the object out when nothing was cached; SGLang's
// decode pods cannot compute a PD request's prompt themselves (a failed transfer aborts the
// request), so a decode answer is its own proof, while its cached_tokens are the prefill pod's
// prefix-cache hits; for TensorRT-LLM only timing applies. A Scanner reads the answer as it
// passes; Judge decides.
package proof

import (
	"bytes"
	"time"

	"github.com/tidwall/gjson"
)

// Result is the verdict on one PD request's KV transfer (the result label of
// tandem_pd_transfer_total).
type Result string

const (
	// Verified: the decode answer's usage shows cached tokens covering the transferred prompt,
	// or its first token came well before a local prefill of the prompt could have ended.
	Verified Result = "verified"
	// Recomputed: the usage shows (about) no cached tokens from an engine known to count
	// transferred KV as cached, or a streamed first token came as late as a local prefill of
	// the prompt would.
	Recomputed Result = "recomputed"
	// Unknown: no evidence either way.
	Unknown Result = "unknown"
)

// Bases of a verdict: what it rests on.
const (
	BasisUsage  = "usage"
	BasisTiming = "timing"
	// BasisProtocol: the engine's decode pods cannot answer a PD request without its KV
	// (SGLang: a decode leg whose transfer failed is aborted, never computed locally).
	BasisProtocol = "protocol"
	BasisNone     = "none"
)

// Engines as the model.aibrix.ai/engine label spells them (pool.Engine*).
const (
	engineVLLM   = "vllm"
	engineSGLang = "sglang"
)

// Thresholds of Judge.
const (
	// verifiedShare: cached tokens at least this share of the prompt verify the transfer.
	verifiedShare = 0.9
	// recomputedShare: cached tokens below this share of the prompt mean it was recomputed.
	recomputedShare = 0.1
	// minPrompt: shorter prompts prove nothing (a block or less of KV).
	minPrompt = 16
	// timingShare: a decode first byte (beyond a prefill leg it includes) at least this share
	// of the local prefill's time counts as a recompute, when that time is at least minTiming (shorter prefills drown in noise).
	timingShare = 0.9
	minTiming   = 200 * time.Millisecond
	// fastShare: a decode first byte after a measured prefill leg within this share of a
	// prefill's service time verifies the transfer (the epp hand-off).
	fastShare = 0.5
	// sidecarFloor: behind a sidecar a recompute is also at least this late on its own (a
	// leg predicted far too long makes every pod's lateness negative).
	sidecarFloor = 0.45
)

// Usage is what the decode answer reported of its prompt.
type Usage struct {
	Prompt int // prompt tokens (0: not reported)
	// Cached tokens, when Details: the answer carried a cached-token count.
	Cached  int
	Details bool
}

// WholePrompt reports that the cached tokens cover the whole prompt, or all of it but its last
// token: more than a prefix-cache hit gives (vLLM computes at least the last prompt token, and
// caches whole blocks only), so the engine counted a KV transfer among them. Only such an answer
// shows that an engine counts transfers (Gate.SawTransfer); a repeated prompt, whose prefix-cache
// hit can reach 90 % of it, does not.
func (u Usage) WholePrompt() bool { return u.Details && u.Prompt > 0 && u.Cached >= u.Prompt-1 }

// Evidence is what is known of one PD request's decode leg.
type Evidence struct {
	// PrefillUnsent: the prefill leg Tandem ran on an SGLang pod, which answers only once it
	// sent the KV, had not answered when the decode answer ended (or failed): the decode
	// answer proves nothing (a pod not in decode mode computes the prompt itself; a leg that
	// failed after sending the KV leaves a healthy answer: neither can be told).
	PrefillUnsent bool
	// Engine of the decode pod: vLLM's usage counts the transferred KV as cached tokens;
	// SGLang's counts the prefill pod's prefix-cache hits instead (it proves nothing of the
	// transfer, but its decode pods cannot recompute); TensorRT-LLM's is not read. "" is taken
	// as vLLM.
	Engine string
	// Usage, when HasUsage: the decode answer carried a usage object.
	Usage    Usage
	HasUsage bool
	// CountsTransfers: the decode pod, or another pod of its model, has reported a PD
	// transfer's KV among its cached tokens (a transfer verified by usage), so its engine is
	// known to count what its KV connector loads as cached. Only then do few cached tokens, or
	// none reported (vLLM leaves the count out when it is 0), mean a recompute: an engine that
	// counts only its own prefix-cache hits (llm-d's inference simulator; a vLLM that stops
	// counting the connector's tokens) reports few cached tokens on every healthy transfer.
	// Until then usage can verify a transfer, never refute one; timing still can.
	CountsTransfers bool
	// DecodeFirstByte is the time from the decode request being forwarded to its first
	// token, the first byte of a streamed answer (0: unknown, as for a JSON answer, whose first
	// byte comes with its last token); LocalPrefill how long a local prefill of the prompt
	// takes, from the pod that prefilled it: the prefill leg's measured duration, else the
	// latency models' prediction there (0: none).
	DecodeFirstByte, LocalPrefill time.Duration
	// PrefillService is the prefill pod's predicted prefill of the prompt, its queue left out
	// (0: its model has learned nothing yet).
	PrefillService time.Duration
	// DecodeQueued: the decode pod had requests waiting for a slot when the decode leg was
	// forwarded or judged; its first token then waited too, and timing cannot refute.
	DecodeQueued bool
	// Sidecar: a decode-side routing sidecar ran the prefill leg once the request was forwarded
	// (the sidecar hand-off): DecodeFirstByte includes the leg, PrefillLeg predicts it, and
	// PeerLate (when HasPeers) is how late the first tokens of the prefill pod's recent requests
	// to other decode pods came (Late). Load on the prefill pod delays every decode pod's first
	// token alike; a recompute, one decode pod's.
	Sidecar    bool
	PrefillLeg time.Duration
	PeerLate   float64
	HasPeers   bool
}

// Late is how late the first token came beyond the prefill leg it includes, in local
// prefills (0 when timing does not apply: no first token timed, or no local prefill known).
func (e Evidence) Late() float64 {
	if e.DecodeFirstByte <= 0 || e.LocalPrefill <= 0 {
		return 0
	}
	return float64(e.DecodeFirstByte-e.PrefillLeg) / float64(e.LocalPrefill)
}

// Judge returns the verdict on a decode answer that succeeded, and what it rests on.
func Judge(e Evidence) (Result, string) {
	if e.Engine == engineSGLang {
		if e.PrefillUnsent {
			return Unknown, BasisProtocol
		}
		return Verified, BasisProtocol
	}
	if e.HasUsage && (e.Engine == "" || e.Engine == engineVLLM) {
		prompt := e.Usage.Prompt
		cached, known := e.Usage.Cached, e.Usage.Details
		if !known && e.CountsTransfers {
			cached, known = 0, true
		}
		if known && prompt >= minPrompt {
			switch {
			case float64(cached) >= verifiedShare*float64(prompt):
				return Verified, BasisUsage
			case float64(cached) >= recomputedShare*float64(prompt):
				return Unknown, BasisUsage
			case e.CountsTransfers:
				return Recomputed, BasisUsage
			}
			// Few cached tokens from an engine not known to count transfers: timing decides.
		}
	}
	if e.LocalPrefill < minTiming || e.DecodeFirstByte <= 0 {
		return Unknown, BasisNone
	}
	late := e.Late()
	switch {
	case e.Sidecar:
		// Later than the prefill pod's other decode pods see, by most of a prefill.
		if e.HasPeers && !e.DecodeQueued && late >= sidecarFloor && late-e.PeerLate >= timingShare {
			return Recomputed, BasisTiming
		}
	case !e.DecodeQueued && late >= timingShare:
		return Recomputed, BasisTiming
	case e.PrefillService >= minTiming && float64(e.DecodeFirstByte) <= fastShare*float64(min(e.LocalPrefill, e.PrefillService)):
		// The first token came well before the prompt could have been computed there: a
		// recompute takes a whole prefill (its service: a queue on the prefill pod lengthens
		// the leg, not a prefill).
		return Verified, BasisTiming
	}
	return Unknown, BasisNone
}

// Scanner follows a response body as it passes and keeps the last usage it carried: of a
// server-sent event stream, the last "data:" event with a usage object (vLLM's final usage
// chunk); of a JSON answer, its usage (or SGLang's meta_info). It holds at most maxLine bytes
// of an event and maxJSON of a JSON answer; beyond them it gives up (no usage). The zero value
// is ready; not safe for concurrent use.
type Scanner struct {
	started, sse, over bool
	skip               bool // the current event is over maxLine: dropped
	done               bool // the stream's "data: [DONE]" was seen
	buf                []byte
	usage              Usage
	found              bool
}

const (
	maxLine = 256 << 10
	maxJSON = 4 << 20
)

// Write feeds the next body chunk.
func (s *Scanner) Write(p []byte) {
	if s.over || len(p) == 0 {
		return
	}
	if !s.started {
		t := bytes.TrimLeft(p, " \t\r\n")
		if len(t) == 0 {
			return
		}
		s.started = true
		s.sse = t[0] != '{'
	}
	if !s.sse {
		if len(s.buf)+len(p) > maxJSON {
			s.over, s.buf = true, nil
			return
		}
		s.buf = append(s.buf, p...)
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(s.buf)+len(p) > maxLine {
				s.buf = s.buf[:0]
				s.skip = true
			} else if !s.skip {
				s.buf = append(s.buf, p...)
			}
			return
		}
		if !s.skip {
			s.buf = append(s.buf, p[:i]...)
			s.line(s.buf)
		}
		s.buf, s.skip = s.buf[:0], false
		p = p[i+1:]
	}
}

func (s *Scanner) line(l []byte) {
	data, ok := bytes.CutPrefix(bytes.TrimRight(l, "\r"), []byte("data:"))
	if ok && string(bytes.TrimSpace(data)) == "[DONE]" {
		s.done = true
		return
	}
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) && !bytes.Contains(data, []byte(`"meta_info"`)) {
		return
	}
	if u, ok := usageOf(bytes.TrimSpace(data)); ok {
		s.usage, s.found = u, true
	}
}

// Done reports that an event stream's final "data: [DONE]" was seen: the evidence is complete
// before the stream ends. Not at its first usage: with stream_options.continuous_usage_stats
// every chunk carries one, and only the last is the answer's.
func (s *Scanner) Done() bool { return s.sse && s.done }

// Streamed reports that the body is an event stream (its first byte came with the first
// token); a JSON answer's first byte comes with its last.
func (s *Scanner) Streamed() bool { return s.sse }

// Usage returns the last usage seen (at the end of the body: the answer's).
func (s *Scanner) Usage() (Usage, bool) {
	if !s.sse && s.started && !s.over && !s.found {
		if u, ok := usageOf(s.buf); ok {
			s.usage, s.found = u, true
		}
		s.buf = nil
	}
	return s.usage, s.found
}

// usageOf reads an answer's (or a chunk's) usage: the OpenAI usage object (chat and
// completions: prompt_tokens and prompt_tokens_details; Responses: input_tokens and
// input_tokens_details, of the answer or, streamed, of its response.completed event's
// response), else SGLang's meta_info. Messages' usage (Anthropic's input_tokens, which leave
// cached tokens out) is not read.
func usageOf(b []byte) (Usage, bool) {
	if !gjson.ValidBytes(b) {
		return Usage{}, false
	}
	for _, path := range []string{"usage", "response.usage"} {
		u := gjson.GetBytes(b, path)
		if !u.IsObject() {
			continue
		}
		prompt, cached := u.Get("prompt_tokens"), u.Get("prompt_tokens_details.cached_tokens")
		if !prompt.Exists() {
			// Responses; Messages' usage has input_tokens too, never input_tokens_details.
			prompt, cached = u.Get("input_tokens"), u.Get("input_tokens_details.cached_tokens")
			if !u.Get("input_tokens_details").IsObject() {
				return Usage{}, false
			}
		}
		out := Usage{Prompt: int(prompt.Int())}
		if cached.Exists() && cached.Type == gjson.Number {
			out.Cached, out.Details = int(cached.Int()), true
		}
		return out, out.Prompt > 0
	}
	if m := gjson.GetBytes(b, "meta_info"); m.IsObject() {
		out := Usage{Prompt: int(m.Get("prompt_tokens").Int())}
		if c := m.Get("cached_tokens"); c.Exists() && c.Type == gjson.Number {
			out.Cached, out.Details = int(c.Int()), true
		}
		return out, out.Prompt > 0
	}
	return Usage{}, false
}
