package sim

import (
	"strings"
	"testing"
)

func TestAnswerText(t *testing.T) {
	for _, c := range []struct {
		name, body, want string
	}{
		{"completion", `{"choices":[{"text":"ab"}]}`, "ab"},
		{"chat completion", `{"choices":[{"message":{"role":"assistant","content":"ab"}}]}`, "ab"},
		{"no choices", `{"error":{"message":"bad"}}`, ""},
		{"streamed completion", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n", "ab"},
		{"streamed chat, role chunk first", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n", "ab"},
		{"stream cut mid-event", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"te", "a"},
	} {
		if got := AnswerText([]byte(c.body)); got != c.want {
			t.Errorf("%s: AnswerText = %q, want %q", c.name, got, c.want)
		}
	}
}

// A real pod's streamed and whole answers to one prompt carry the same text.
func TestAnswerTextOfARealPod(t *testing.T) {
	s := StartForTest(t, PodConfig{Name: "p", Engine: EngineVLLM, Role: RoleStandard, Model: testModel,
		Params: testParams(), TimeScale: 0.001})
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"` + testModel + `","prompt":"hello there","max_tokens":5%s}`},
		{"/v1/chat/completions", `{"model":"` + testModel + `","messages":[{"role":"user","content":"hello there"}],"max_tokens":5%s}`},
	} {
		whole := post(t, s.URL(), c.path, strings.Replace(c.body, "%s", "", 1))
		streamed := post(t, s.URL(), c.path, strings.Replace(c.body, "%s", `,"stream":true`, 1))
		w, st := AnswerText(whole.body), AnswerText(streamed.body)
		if whole.status != 200 || streamed.status != 200 || w == "" || w != st {
			t.Errorf("%s: whole %d %q, streamed %d %q; want 200 and the same non-empty text", c.path, whole.status, w, streamed.status, st)
		}
	}
}
