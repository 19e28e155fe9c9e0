package handoff

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/tandem-epp/tandem/internal/pool"
)

// AbortResult is the outcome of asking a decode pod to drop a request (a metric label).
type AbortResult string

// Abort outcomes, as the seed names them.
const (
	AbortOK              AbortResult = "ok"
	AbortError           AbortResult = "error"
	AbortSkippedDisabled AbortResult = "skipped_disabled"  // AIBRIX_DECODE_ABORT_TIMEOUT is 0
	AbortSkippedNoRID    AbortResult = "skipped_no_rid"    // not an SGLang leg
	AbortSkippedNoTarget AbortResult = "skipped_no_target" // no decode endpoint
)

// Aborter asks SGLang decode pods to drop a request through POST /abort_request {"rid": …}.
// SGLang matches the rid, not X-Request-Id. Safe for concurrent use.
type Aborter struct {
	client *http.Client
	clock  Clock
}

// NewAborter uses client (nil: a client that does not follow redirects) and clock (nil: RealClock).
func NewAborter(client *http.Client, clock Clock) *Aborter {
	if client == nil {
		client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if clock == nil {
		clock = RealClock{}
	}
	return &Aborter{client: client, clock: clock}
}

// AbortPolicy is AIBRIX_DECODE_ABORT_TIMEOUT (per attempt; 0 disables aborts) and
// AIBRIX_DECODE_ABORT_RETRY_DELAY (0: a single attempt).
type AbortPolicy struct {
	Timeout    time.Duration
	RetryDelay time.Duration
}

// Abort sends one attempt at once and, when retry is set, a second one after RetryDelay: the
// first can arrive before SGLang has registered the rid. The retry is skipped when stop is
// cancelled first (the decode leg started responding). Attempts run on their own timeouts,
// not on stop. The result is ok when any attempt got a 200.
func (a *Aborter) Abort(stop context.Context, decode *pool.Endpoint, rid string, p AbortPolicy, retry bool) AbortResult {
	switch {
	case p.Timeout <= 0:
		return AbortSkippedDisabled
	case rid == "":
		return AbortSkippedNoRID
	case decode == nil:
		return AbortSkippedNoTarget
	}
	result := a.attempt(decode, rid, p.Timeout)
	if !retry || p.RetryDelay <= 0 {
		return result
	}
	select {
	case <-stop.Done():
		return result
	case <-a.clock.After(p.RetryDelay):
	}
	if a.attempt(decode, rid, p.Timeout) == AbortOK {
		result = AbortOK
	}
	return result
}

func (a *Aborter) attempt(decode *pool.Endpoint, rid string, timeout time.Duration) AbortResult {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	body, _ := json.Marshal(struct {
		RID string `json:"rid"`
	}{rid})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+decode.HostPort()+"/abort_request", bytes.NewReader(body))
	if err != nil {
		return AbortError
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return AbortError
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return AbortError
	}
	return AbortOK
}
