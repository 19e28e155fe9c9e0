package sim

import (
	"bufio"
	"bytes"
	"context"
	"strings"

	"github.com/tidwall/gjson"
)

// TB is the part of testing.TB that StartForTest needs (this package does not import testing,
// since the sim command and the demo link it).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// StartForTest starts a pod on 127.0.0.1 for a test, failing the test if it cannot start, and
// closes it when the test ends.
func StartForTest(t TB, cfg PodConfig) *Server {
	t.Helper()
	s, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("starting simulated %s pod %q (role %q): %v", cfg.Engine, cfg.Name, cfg.Role, err)
	}
	t.Cleanup(s.Close)
	return s
}

// AnswerText is the generated text of an answer of any API the simulator serves, whole (a
// JSON object) or streamed (server-sent events): choices[0]'s text or message content
// (completions, chat), content[0].text (Messages), output[0].content[0].text (Responses); or
// the text and delta content of every chunk, the text_delta of every content_block_delta, the
// delta of every response.output_text.delta, in order. Lines that are not JSON events are
// skipped, so a stream cut short yields the text received before the cut.
func AnswerText(body []byte) string {
	trimmed := bytes.TrimSpace(body)
	if !bytes.HasPrefix(trimmed, []byte("data:")) && !bytes.HasPrefix(trimmed, []byte("event:")) {
		c := gjson.GetBytes(body, "choices.0")
		return c.Get("text").Str + c.Get("message.content").Str +
			gjson.GetBytes(body, "content.0.text").Str + gjson.GetBytes(body, "output.0.content.0.text").Str
	}
	var sb strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" || !gjson.Valid(line) {
			continue
		}
		switch gjson.Get(line, "type").Str {
		case "content_block_delta":
			sb.WriteString(gjson.Get(line, "delta.text").Str)
		case "response.output_text.delta":
			sb.WriteString(gjson.Get(line, "delta").Str)
		case "":
			c := gjson.Get(line, "choices.0")
			sb.WriteString(c.Get("text").Str + c.Get("delta.content").Str)
		}
	}
	return sb.String()
}
