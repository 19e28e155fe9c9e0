package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

const testModel = "sim-model"

// startPod starts a pod at a fast time scale and closes it when the test ends. Without
// Params it gets testParams: peers wait for each other as long as a test may take.
func startPod(t *testing.T, cfg PodConfig) *Server {
	t.Helper()
	if cfg.Model == "" {
		cfg.Model = testModel
	}
	if cfg.Params == (Params{}) {
		cfg.Params = testParams()
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 0.001
	}
	return StartForTest(t, cfg)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("answer is not JSON (%v): %s", err, r.body)
	}
	return m
}

// post sends body to base+path and reads the whole answer.
func post(t *testing.T, base, path, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s%s: %v", base, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

func get(t *testing.T, url string) reply {
	t.Helper()
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// events splits an SSE body into its data payloads.
func events(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line without data: %q", line)
		}
		out = append(out, data)
	}
	return out
}

// streamText joins the text of completions or chat chunks.
func streamText(t *testing.T, body []byte) string {
	t.Helper()
	var sb strings.Builder
	for _, e := range events(t, body) {
		if e == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("chunk %q: %v", e, err)
		}
		for _, ch := range c.Choices {
			sb.WriteString(ch.Text + ch.Delta.Content)
		}
	}
	return sb.String()
}

// answerText is the text of a non-streamed completions or chat answer.
func answerText(t *testing.T, r reply) string {
	t.Helper()
	var c struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("answer %s: %v", r.body, err)
	}
	return c.Choices[0].Text + c.Choices[0].Message.Content
}

func mustStatus(t *testing.T, r reply, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d; body %s", r.status, want, r.body)
	}
}

// mustJSON marshals v, failing the test on error.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// testParams are DefaultParams whose held KV and rendezvous outlast any test (10 s of wall
// time at TimeScale 0.001), so a slow machine cannot expire them between two legs.
func testParams() Params {
	p := DefaultParams()
	p.KVHold, p.BootstrapTimeout = 10000, 10000
	return p
}

// shortBootstrap has a rendezvous timeout of 0.1 s of wall time, for timeout tests.
func shortBootstrap() Params {
	p := testParams()
	p.BootstrapTimeout = 100
	return p
}
