package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// result is what one request experienced, as the client saw it.
type result struct {
	ttft, tpot float64 // seconds; tpot over the tokens after the first
	e2e        float64 // seconds from sending to the last token
	tokens     int     // content chunks received
	ok         bool    // 200, every asked token, and the stream's [DONE]
	err        string
}

// target says where request i goes: the gateway, or (the bench's round-robin) a pod.
type target func(i int) string

// replay sends the schedule's requests at their instants (from now), each streamed, and
// waits for all of them. Every request carries the same objective headers whatever the router.
func replay(ctx context.Context, reqs []request, to target, tpotObjective float64) []result {
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 30 * time.Second,
		DisableCompression: true,
	}}
	defer client.CloseIdleConnections()
	out := make([]result, len(reqs))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range reqs {
		if d := time.Until(t0.Add(time.Duration(reqs[i].at * float64(time.Second)))); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			out[i] = result{err: "cancelled"}
			continue
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			out[i] = send(ctx, client, to(i), &reqs[i], tpotObjective)
		}(i)
	}
	wg.Wait()
	return out
}

// send posts one streamed completion and times its tokens.
func send(ctx context.Context, client *http.Client, base string, q *request, tpotObjective float64) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(q.body))
	if err != nil {
		return result{err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-slo-ttft-ms", strconv.Itoa(int(q.sloTTFT*1000)))
	req.Header.Set("x-slo-tpot-ms", strconv.Itoa(int(tpotObjective*1000)))
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return result{err: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))}
	}
	var r result
	var first, last time.Time
	done := false
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := rd.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if bytes.Equal(data, []byte("[DONE]")) {
				done = true
			} else if hasText(data) {
				now := time.Now()
				if r.tokens == 0 {
					first = now
				}
				last = now
				r.tokens++
			}
		}
		if err != nil {
			if err != io.EOF {
				r.err = "stream: " + err.Error()
			}
			break
		}
	}
	if r.tokens > 0 {
		r.ttft = first.Sub(start).Seconds()
		r.e2e = last.Sub(start).Seconds()
		if r.tokens > 1 {
			r.tpot = last.Sub(first).Seconds() / float64(r.tokens-1)
		}
	}
	switch {
	case r.err != "":
	case !done:
		r.err = "stream ended without [DONE]"
	case r.tokens < q.out:
		r.err = fmt.Sprintf("%d tokens of %d", r.tokens, q.out)
	default:
		r.ok = true
	}
	return r
}

// hasText says whether an SSE chunk of a completion stream carries generated text.
func hasText(data []byte) bool {
	var c struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &c) != nil {
		return false
	}
	for _, ch := range c.Choices {
		if ch.Text != "" {
			return true
		}
	}
	return false
}
