package handoff

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/pool"
)

// sglangBody has odd spacing, escapes and tools on purpose: none of it may change.
const sglangBody = "{\"model\":\"m\", \"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9llo  \\n\"}],\n \"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"stream\":true,\"max_tokens\":20}"

func TestSGLangPrepareExactBodies(t *testing.T) {
	prefill := endpoint("p0", "10.1.2.3", 30000, pool.EngineSGLang, nil, nil)
	s := &SGLang{}
	plan, err := s.Prepare(context.Background(), &Leg{RequestID: "req-1", Body: []byte(sglangBody), Prefill: prefill})
	if err != nil {
		t.Fatal(err)
	}
	room := gjson.GetBytes(plan.DecodeBody, "bootstrap_room").Raw
	rid := fmt.Sprintf("req-1-%08x%08x", processRandom, 1)
	base := strings.TrimSuffix(sglangBody, "}")
	wantDecode := base + `,"bootstrap_host":"10.1.2.3","bootstrap_port":8998,"bootstrap_room":` + room + `,"rid":"` + rid + `"}`
	if string(plan.DecodeBody) != wantDecode {
		t.Errorf("decode body\n got %s\nwant %s", plan.DecodeBody, wantDecode)
	}
	wantPrefill := strings.Replace(strings.Replace(wantDecode, `"stream":true,"max_tokens":20`, `"stream":false,"max_tokens":1`, 1),
		`"rid":"`+rid+`"}`, `"rid":"`+rid+`","max_completion_tokens":1}`, 1)
	if string(plan.PrefillBody) != wantPrefill {
		t.Errorf("prefill body\n got %s\nwant %s", plan.PrefillBody, wantPrefill)
	}
	if !plan.Async || plan.RID != rid || plan.BadResponseFails || plan.FailsAfterResponse {
		t.Errorf("plan flags = %+v", plan)
	}
	if r := gjson.GetBytes(plan.DecodeBody, "bootstrap_room"); r.Type != gjson.Number || strings.ContainsAny(r.Raw, ".e-") {
		t.Errorf("bootstrap_room %q is not a non-negative integer", r.Raw)
	}
}

func TestSGLangMessageBytesStableOver200Iterations(t *testing.T) {
	prefill := endpoint("p0", "10.1.2.3", 30000, pool.EngineSGLang, nil, nil)
	s := &SGLang{}
	sum := func(b []byte, key string) [32]byte { return sha256.Sum256([]byte(gjson.GetBytes(b, key).Raw)) }
	wantMsgs, wantTools := sum([]byte(sglangBody), "messages"), sum([]byte(sglangBody), "tools")
	rooms := map[string]bool{}
	for i := 0; i < 200; i++ {
		plan, err := s.Prepare(context.Background(), &Leg{RequestID: "r", Body: []byte(sglangBody), Prefill: prefill})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range [][]byte{plan.DecodeBody, plan.PrefillBody} {
			if sum(b, "messages") != wantMsgs || sum(b, "tools") != wantTools {
				t.Fatalf("iteration %d: messages or tools bytes changed: %s", i, b)
			}
		}
		// Everything up to the client's last key is byte-identical in the decode body.
		if !bytes.HasPrefix(plan.DecodeBody, []byte(strings.TrimSuffix(sglangBody, "}"))) {
			t.Fatalf("iteration %d: decode body does not start with the client's bytes: %s", i, plan.DecodeBody)
		}
		if gjson.GetBytes(plan.PrefillBody, "rid").Str != plan.RID || gjson.GetBytes(plan.DecodeBody, "rid").Str != plan.RID {
			t.Fatalf("iteration %d: rid differs between legs", i)
		}
		if gjson.GetBytes(plan.PrefillBody, "bootstrap_room").Raw != gjson.GetBytes(plan.DecodeBody, "bootstrap_room").Raw {
			t.Fatalf("iteration %d: room differs between legs", i)
		}
		rooms[gjson.GetBytes(plan.DecodeBody, "bootstrap_room").Raw] = true
	}
	if len(rooms) < 199 {
		t.Errorf("only %d distinct rooms in 200 requests", len(rooms))
	}
}

func TestSGLangBootstrapPortAndRefusals(t *testing.T) {
	cases := []struct {
		name, body, annotation string
		wantPort               int64
		wantStatus             int
		wantParam              string
	}{
		{name: "default port", body: `{"prompt":"p"}`, wantPort: 8998},
		{name: "annotated port", body: `{"prompt":"p"}`, annotation: "9100", wantPort: 9100},
		{name: "bad annotation", body: `{"prompt":"p"}`, annotation: "nine", wantStatus: 503},
		{name: "port out of range", body: `{"prompt":"p"}`, annotation: "70000", wantStatus: 503},
		{name: "duplicate bootstrap_room", body: `{"bootstrap_room":1,"prompt":"p","bootstrap_room":2}`, wantStatus: 400, wantParam: "bootstrap_room"},
		{name: "duplicate rid", body: `{"rid":"a","rid":"b"}`, wantStatus: 400, wantParam: "rid"},
		{name: "duplicate min_tokens", body: `{"min_tokens":1,"min_tokens":2}`, wantStatus: 400, wantParam: "min_tokens"},
		{name: "client bootstrap keys are overwritten", body: `{"bootstrap_host":"evil","bootstrap_port":1}`, wantPort: 8998},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ann := map[string]string{}
			if c.annotation != "" {
				ann[pool.AnnotationSGLangBootstrapPort] = c.annotation
			}
			prefill := endpoint("p0", "10.1.2.3", 30000, pool.EngineSGLang, nil, ann)
			plan, err := (&SGLang{}).Prepare(context.Background(), &Leg{RequestID: "r", Body: []byte(c.body), Prefill: prefill})
			if c.wantStatus != 0 {
				ae := asAPIError(t, err)
				if ae.Status != c.wantStatus || ae.Param != c.wantParam {
					t.Fatalf("got %v, want %d param %q", ae, c.wantStatus, c.wantParam)
				}
				if c.wantStatus == 503 && !strings.Contains(ae.Message, pool.AnnotationSGLangBootstrapPort) {
					t.Errorf("message %q does not name the annotation", ae.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := gjson.GetBytes(plan.DecodeBody, "bootstrap_port").Int(); got != c.wantPort {
				t.Errorf("bootstrap_port = %d, want %d", got, c.wantPort)
			}
			if got := gjson.GetBytes(plan.DecodeBody, "bootstrap_host").Str; got != "10.1.2.3" {
				t.Errorf("bootstrap_host = %q", got)
			}
		})
	}
}

func TestRIDsUniqueFixedWidthAndPrefixFree(t *testing.T) {
	var r RIDs
	const workers, each = 8, 500
	var mu sync.Mutex
	all := map[string]bool{}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				id := r.Next("same-client-id")
				mu.Lock()
				all[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(all) != workers*each {
		t.Fatalf("%d distinct rids, want %d", len(all), workers*each)
	}
	shape := regexp.MustCompile(`^same-client-id-[0-9a-f]{16}$`)
	for id := range all {
		if !shape.MatchString(id) {
			t.Fatalf("rid %q does not match %s", id, shape)
		}
	}
	// Equal length and distinct means no rid is a prefix of another.
	if got := r.Next(""); !regexp.MustCompile(`^tandem-[0-9a-f]{16}$`).MatchString(got) {
		t.Errorf("rid for an empty request id = %q", got)
	}
}
