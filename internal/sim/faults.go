package sim

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Faults are injected failures, per pod (PodConfig.Faults, POST /sim/faults) or per request
// (the X-Sim-Fault header). Durations here are wall time, not model time.
type Faults struct {
	// ErrorRate is the fraction of inference requests answered at once with ErrorStatus.
	ErrorRate   float64 `json:"error_rate"`
	ErrorStatus int     `json:"error_status"` // default 500
	// HangBeforeFirstToken computes the prefill, then never answers (a streaming request gets
	// its headers first), until the client leaves or the pod closes.
	HangBeforeFirstToken bool `json:"hang_before_first_token"`
	// HangAfterTokens, when > 0, stops after that many output tokens and hangs.
	HangAfterTokens int `json:"hang_after_tokens"`
	// SlowStart delays everything (before the response headers) by this many seconds.
	SlowStart float64 `json:"slow_start_seconds"`
	// PullDelay makes a decode leg wait this many seconds, its KV blocks allocated, before it
	// pulls the prompt's KV from the prefill pod (a slow KV link or a busy decode pod): the
	// prefill pod holds the KV meanwhile.
	PullDelay float64 `json:"pull_delay_seconds"`
	// RecomputeKV breaks a decode pod's KV connector, silently: a decode leg never pulls the
	// prompt's KV from its prefill pod (which keeps it until it expires) but prefills the
	// prompt itself, taking a local prefill's time, and still answers 200; its usage reports
	// only what its own prefix cache held as cached tokens. Other legs are unaffected.
	RecomputeKV bool `json:"recompute_kv"`
	// WrongKVPort misconfigures a prefill pod's KV channel: a vLLM prefill leg answers with a
	// kv_transfer_params.remote_port nothing listens on, so its decode leg cannot pull the KV
	// (which stays held here until it expires). A decode pod with kv_load_failure_policy
	// "recompute" then computes the prompt itself; with "fail" it answers an error.
	WrongKVPort bool `json:"wrong_kv_port"`
}

func (f Faults) validate() error {
	switch {
	case f.ErrorRate < 0 || f.ErrorRate > 1:
		return fmt.Errorf("faults.error_rate %v: must be in [0, 1]", f.ErrorRate)
	case f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599):
		return fmt.Errorf("faults.error_status %d: must be 400–599", f.ErrorStatus)
	case f.HangAfterTokens < 0:
		return fmt.Errorf("faults.hang_after_tokens %d: must be ≥ 0", f.HangAfterTokens)
	case f.SlowStart < 0:
		return fmt.Errorf("faults.slow_start_seconds %v: must be ≥ 0", f.SlowStart)
	case f.PullDelay < 0:
		return fmt.Errorf("faults.pull_delay_seconds %v: must be ≥ 0", f.PullDelay)
	}
	return nil
}

func (f Faults) status() int {
	if f.ErrorStatus == 0 {
		return http.StatusInternalServerError
	}
	return f.ErrorStatus
}

func (f Faults) fails() bool {
	return f.ErrorRate > 0 && (f.ErrorRate >= 1 || rand.Float64() < f.ErrorRate)
}

// faultsFor merges the pod's faults with the request's X-Sim-Fault items for this pod's role.
func (s *Server) faultsFor(h http.Header) (Faults, *httpError) {
	f := s.Faults()
	for _, v := range h.Values(HeaderFault) {
		for _, item := range strings.Split(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			applies := true
			for _, role := range []string{RolePrefill, RoleDecode, "standard"} {
				if rest, ok := strings.CutPrefix(item, role+"-"); ok {
					item = rest
					applies = role == s.cfg.Role || (role == "standard" && s.cfg.Role == RoleStandard)
					break
				}
			}
			var g Faults
			if err := parseFault(item, &g); err != nil {
				return f, badRequest("", "header %s: %v", HeaderFault, err)
			}
			if !applies {
				continue
			}
			if g.ErrorRate > 0 {
				f.ErrorRate, f.ErrorStatus = 1, g.ErrorStatus
			}
			f.HangBeforeFirstToken = f.HangBeforeFirstToken || g.HangBeforeFirstToken
			if g.HangAfterTokens > 0 {
				f.HangAfterTokens = g.HangAfterTokens
			}
			if g.SlowStart > 0 {
				f.SlowStart = g.SlowStart
			}
			if g.PullDelay > 0 {
				f.PullDelay = g.PullDelay
			}
			f.RecomputeKV = f.RecomputeKV || g.RecomputeKV
			f.WrongKVPort = f.WrongKVPort || g.WrongKVPort
		}
	}
	return f, nil
}

func parseFault(item string, g *Faults) error {
	switch {
	case item == "hang":
		g.HangBeforeFirstToken = true
	case item == "recompute":
		g.RecomputeKV = true
	case item == "wrong-kv-port":
		g.WrongKVPort = true
	case strings.HasPrefix(item, "hang-after-"):
		n, err := strconv.Atoi(strings.TrimPrefix(item, "hang-after-"))
		if err != nil || n < 1 {
			return fmt.Errorf("%q: want hang-after-N with N ≥ 1", item)
		}
		g.HangAfterTokens = n
	case strings.HasPrefix(item, "pull-delay-"):
		d, err := time.ParseDuration(strings.TrimPrefix(item, "pull-delay-"))
		if err != nil || d < 0 {
			return fmt.Errorf("%q: want pull-delay-DURATION, e.g. pull-delay-2s", item)
		}
		g.PullDelay = d.Seconds()
	case strings.HasPrefix(item, "slow-"):
		d, err := time.ParseDuration(strings.TrimPrefix(item, "slow-"))
		if err != nil || d < 0 {
			return fmt.Errorf("%q: want slow-DURATION, e.g. slow-200ms", item)
		}
		g.SlowStart = d.Seconds()
	default:
		code, err := strconv.Atoi(item)
		if err != nil || code < 400 || code > 599 {
			return fmt.Errorf("%q: want a status 400–599, hang, hang-after-N, slow-DURATION, pull-delay-DURATION, recompute or wrong-kv-port, optionally prefixed by prefill-, decode- or standard-", item)
		}
		g.ErrorRate, g.ErrorStatus = 1, code
	}
	return nil
}
