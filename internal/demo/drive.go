package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-epp/tandem/internal/demo/workload"
)

// Result is what the client saw for one request.
type Result struct {
	Req    *workload.Request
	Status int
	Pod    string // X-Sim-Pod: the pod that produced the tokens
	// PD is true when that pod got its KV cache from a prefill pod (X-Sim-Transfer-Seconds > 0).
	PD bool
	// LocalPrefill is true when that pod computed the prompt itself (X-Sim-Prefill-Seconds > 0).
	LocalPrefill bool
	// Recomputed is true for a PD request whose decode pod had its KV connector broken by the
	// demo (Options.BrokenDecode) and computed the prompt itself: the pod's own account.
	Recomputed bool
	Sent       time.Time // when the request was sent
	Done       time.Time // when its answer ended
	Strategy   string    // routing-strategy response header
	Steps      []string  // decision trace steps (x-tandem-trace)
	TTFT       time.Duration
	ITLs       []time.Duration
	Tokens     int
	Err        string
}

// Progress counts requests as they go; safe for concurrent use.
type Progress struct {
	Total                        int
	Sent, Done, Failed, InFlight atomic.Int64
	byRole                       sync.Map // role -> *atomic.Int64
}

func (p *Progress) addRole(role string) {
	v, _ := p.byRole.LoadOrStore(role, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (p *Progress) role(role string) int64 {
	if v, ok := p.byRole.Load(role); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// Line is the live progress line.
func (p *Progress) Line(elapsed time.Duration) string {
	return fmt.Sprintf("%5.1fs  sent %d/%d  done %d  failed %d  in flight %d  │ PD %d  combined %d",
		elapsed.Seconds(), p.Sent.Load(), p.Total, p.Done.Load(), p.Failed.Load(), p.InFlight.Load(), p.role(KindPD), p.role(KindCombined))
}

// Kinds of served request, by the pod that produced the tokens and where its KV came from.
const (
	KindPD         = "decode (PD)"             // a decode pod, KV from a prefill pod
	KindRecomputed = "decode (PD, recomputed)" // a decode pod whose broken KV connector made it compute the prompt
	KindDecode     = "decode (no prefill leg)" // a decode pod that computed the prompt itself
	KindCombined   = "standard (combined)"     // the standard pod ran both phases
	KindPrefill    = "prefill pod (whole request)"
	KindUnknown    = "unknown pod"
)

// Kind classifies a served request, its pod having role.
func (r *Result) Kind(role string) string {
	if r.Recomputed {
		return KindRecomputed
	}
	return Kind(role, r.PD)
}

// Kind classifies a served request by its pod's role and where its KV came from.
func Kind(role string, pd bool) string {
	switch role {
	case "decode":
		if pd {
			return KindPD
		}
		return KindDecode
	case "standard":
		return KindCombined
	case "prefill":
		return KindPrefill
	}
	return KindUnknown
}

// Drive replays reqs against the gateway at their arrival offsets, streaming every request,
// and returns one Result per request (in schedule order).
func Drive(ctx context.Context, gatewayURL string, reqs []workload.Request, podRole map[string]string, prog *Progress) []Result {
	client := &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512, DisableCompression: true}}
	defer client.CloseIdleConnections()
	results := make([]Result, len(reqs))
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := range reqs {
		if wait := time.Until(start.Add(reqs[i].At)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				wg.Wait()
				return results[:i]
			case <-timer.C:
			}
		}
		prog.Sent.Add(1)
		prog.InFlight.Add(1)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer prog.InFlight.Add(-1)
			results[i] = send(ctx, client, gatewayURL, &reqs[i])
			if results[i].Err != "" {
				prog.Failed.Add(1)
			} else {
				prog.Done.Add(1)
				prog.addRole(Kind(podRole[results[i].Pod], results[i].PD))
			}
		}(i)
	}
	wg.Wait()
	return results
}

type completionChunk struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
}

func send(ctx context.Context, client *http.Client, gatewayURL string, r *workload.Request) Result {
	res := Result{Req: r}
	body, _ := json.Marshal(map[string]any{
		"model": Model, "prompt": r.Prompt, "max_tokens": r.OutputTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	res.Sent = t0
	resp, err := client.Do(req)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Pod = resp.Header.Get("X-Sim-Pod")
	if v, err := strconv.ParseFloat(resp.Header.Get("X-Sim-Transfer-Seconds"), 64); err == nil && v > 0 {
		res.PD = true
	}
	if v, err := strconv.ParseFloat(resp.Header.Get("X-Sim-Prefill-Seconds"), 64); err == nil && v > 0 {
		res.LocalPrefill = true
	}
	res.Strategy = resp.Header.Get("routing-strategy")
	var trace struct {
		Steps []string `json:"steps"`
	}
	if json.Unmarshal([]byte(resp.Header.Get("x-tandem-trace")), &trace) == nil {
		res.Steps = trace.Steps
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
		return res
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	last := t0
	for {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok && data != "[DONE]" {
			var c completionChunk
			if json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 && c.Choices[0].Text != "" {
				now := time.Now()
				if res.Tokens == 0 {
					res.TTFT = now.Sub(t0)
				} else {
					res.ITLs = append(res.ITLs, now.Sub(last))
				}
				last = now
				res.Tokens++
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			res.Err = "stream cut: " + err.Error()
			break
		}
	}
	res.Done = time.Now()
	if res.Err == "" && res.Tokens == 0 {
		res.Err = "no tokens in the stream"
	}
	return res
}
