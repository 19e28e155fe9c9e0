package pd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/pd"
	"github.com/tandem-epp/tandem/internal/picker"
	"github.com/tandem-epp/tandem/internal/pool"
	"github.com/tandem-epp/tandem/internal/prefix"
	"github.com/tandem-epp/tandem/internal/request"
)

// llm-d's prefix-based decider, worked by hand: the decode pod holds m blocks of 64 tokens
// of a P-token prompt; it disaggregates when P ≥ promptTokens, P ≥ nonCachedTokens and
// P − 64·m ≥ nonCachedTokens; nonCachedTokens 0 never does.
func TestPrefixBasedPDDecider(t *testing.T) {
	cases := []struct {
		name                     string
		params                   string
		promptTokens, heldBlocks int
		disaggregate             bool
	}{
		{"uncached, long enough", `{"nonCachedTokens": 16}`, 384, 0, true},
		{"384 − 5·64 = 64 ≥ 16", `{"nonCachedTokens": 16}`, 384, 5, true},
		{"384 − 6·64 = 0 < 16", `{"nonCachedTokens": 16}`, 384, 6, false},
		{"shorter than nonCachedTokens", `{"nonCachedTokens": 16}`, 10, 0, false},
		{"disabled", `{"nonCachedTokens": 0}`, 384, 0, false},
		{"shorter than promptTokens", `{"nonCachedTokens": 16, "promptTokens": 400}`, 384, 0, false},
		{"as long as promptTokens", `{"nonCachedTokens": 16, "promptTokens": 384}`, 384, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := pd.NewRegistry(pd.New(pd.Options{}))
			deps := picker.NewDeps(nil, config.DefaultPD().PrefixCache)
			deps.PrefixCache.BlockSize = 64
			p, err := reg.New(pd.TypePrefixBasedPDDecider, "", json.RawMessage(tc.params), deps)
			if err != nil {
				t.Fatal(err)
			}
			e := pool.NewEndpoint("ns", "d", "10.0.0.1", 8000, 0, nil, nil)
			text := strings.Repeat("abcd", tc.promptTokens)
			if tc.heldBlocks > 0 {
				deps.Prefix.Add("m", prefix.Hash(nil, text, prefix.BlockBytes(64))[:tc.heldBlocks], e.Key())
			}
			cy := &picker.Cycle{Req: &request.Request{Model: "m", Prompt: text, PromptTokens: tc.promptTokens}, State: &picker.CycleState{}}
			if got := p.(pd.PDDecider).Disaggregate(cy, e); got != tc.disaggregate {
				t.Fatalf("disaggregate %v, want %v", got, tc.disaggregate)
			}
		})
	}
	if _, err := pd.NewRegistry(nil).New(pd.TypePrefixBasedPDDecider, "", json.RawMessage(`{"nonCachedTokens": -1}`), nil); err == nil ||
		!strings.Contains(err.Error(), "nonCachedTokens=-1: must be 0 or more") {
		t.Fatalf("negative: %v", err)
	}
}

const disaggFile = `
plugins:
- type: prefill-filter
- type: decode-filter
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters: %s
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}]
- name: decode
  plugins: [{pluginRef: decode-filter}]
`

// The disagg handler's stage orders and parameter forms: decode first with a decider,
// prefill first (always), llm-d's deprecated flat names, and the forms it refuses.
func TestDisaggHandler(t *testing.T) {
	cases := []struct {
		name, params string
		pd           bool
		err          string
	}{
		{"decode first, always", `{deciders: {prefill: always-disagg-pd-decider}}`, true, ""},
		{"decode first, no decider: decode only", `{}`, false, ""},
		{"prefill first", `{stageOrder: prefill-first}`, true, ""},
		{"llm-d's deprecated flat form", `{deciderPluginName: always-disagg-pd-decider, decodeProfile: decode}`, true, ""},
		{"encode is not supported", `{deciders: {encode: always-disagg-pd-decider}}`, false, "parameters.deciders.encode=always-disagg-pd-decider: encode disaggregation (E/P/D) is not supported"},
		{"a prefill decider in prefill-first order", `{stageOrder: prefill-first, deciders: {prefill: always-disagg-pd-decider}}`, false, "not supported in prefill-first"},
		{"a bad stage order", `{stageOrder: sideways}`, false, "parameters.stageOrder=sideways: must be decode-first or prefill-first"},
		{"an undeclared decider", `{deciders: {prefill: oracle}}`, false, `parameters.deciders.prefill=oracle: no plugin named "oracle" is declared`},
	}
	var eps []*pool.Endpoint
	for i, role := range []string{"prefill", "decode"} {
		eps = append(eps, pool.NewEndpoint("ns", role, fmt.Sprintf("10.5.0.%d", i+1), 8000, 0,
			map[string]string{pool.LabelLLMDRole: role, pool.LabelModelName: "m"}, nil))
	}
	snap := pool.NewStore().Publish(pool.Info{}, eps, true)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := config.ParseFile("epp.yaml", []byte(fmt.Sprintf(disaggFile, tc.params)), config.FileOptions{KnownPluginTypes: pd.IsPluginType})
			if err != nil {
				t.Fatal(err)
			}
			p, err := buildPicker(f)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r, _ := request.Parse("POST", "/v1/completions", map[string]string{}, []byte(`{"model":"m","prompt":"hello there"}`))
			d, err := p.Router.Schedule(context.Background(), r, snap, snap.Endpoints)
			if err != nil {
				t.Fatal(err)
			}
			if d.Destination[0].Name != "decode" || (len(d.Prefill) > 0) != tc.pd || (tc.pd && d.Prefill[0].Name != "prefill") {
				t.Fatalf("destination %s prefill %v (step %s)", d.Destination[0].Name, d.Prefill, d.Step)
			}
			// A PD pick counts in the PD trackers until the decode pod answers.
			if tc.pd && p.Cascade.PrefillInFlight(eps[0].Key()) != 1 {
				t.Fatal("the prefill pod's in-flight count did not move")
			}
			d.Lifecycle.ResponseHeaders(200, nil)
			d.Lifecycle.Done(nil)
			if p.Cascade.PrefillInFlight(eps[0].Key()) != 0 || p.Cascade.PendingDecode(eps[1].Key()) != 0 {
				t.Fatal("trackers not released")
			}
		})
	}
}

// llm-d's handler with the pair-match labels: the decode pick is paired with the prefill pod
// of its revision, whichever the prefill profile ranked first, and its decode fallbacks are of
// its revision too; with no prefill pod of the decode pick's revision the request is served
// decode-only. The trace names the prefill pod left out.
func TestDisaggHandlerNeverPairsRevisions(t *testing.T) {
	f, err := config.ParseFile("epp.yaml", []byte(fmt.Sprintf(disaggFile, `{deciders: {prefill: always-disagg-pd-decider}}`)), config.FileOptions{KnownPluginTypes: pd.IsPluginType})
	if err != nil {
		t.Fatal(err)
	}
	p, err := buildPicker(f)
	if err != nil {
		t.Fatal(err)
	}
	ep := func(i int, name, role, rev string) *pool.Endpoint {
		return pool.DefaultPairMatch.NewEndpoint("ns", name, fmt.Sprintf("10.6.0.%d", i), 8000, 0,
			map[string]string{pool.LabelLLMDRole: role, pool.LabelModelName: "m", pool.LabelDisaggRevision: rev}, nil)
	}
	prefillA, prefillB, decodeB := ep(1, "prefill-a", "prefill", "a"), ep(2, "prefill-b", "prefill", "b"), ep(3, "decode-b", "decode", "b")
	decodeA := ep(4, "decode-a", "decode", "a")
	for _, tc := range []struct {
		name        string
		eps         []*pool.Endpoint
		wantPrefill string
	}{
		{"both revisions of prefill", []*pool.Endpoint{prefillA, prefillB, decodeB}, "prefill-b"},
		{"no prefill pod of the decode pod's revision", []*pool.Endpoint{prefillA, decodeB}, ""},
		{"two revisions of both roles", []*pool.Endpoint{prefillA, prefillB, decodeA, decodeB}, "*"},
		// Mid-rollout: decode-c's revision has no prefill pod yet. Whichever decode pod ranks
		// first, the request is a pair of one revision, never decode-only.
		{"a decode pod whose revision has no prefill pod", []*pool.Endpoint{prefillA, prefillB, decodeA, decodeB, ep(5, "decode-c", "decode", "c")}, "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := pool.NewStore().Publish(pool.Info{}, tc.eps, true)
			for i := 0; i < 6; i++ {
				r, _ := request.Parse("POST", "/v1/completions", map[string]string{}, []byte(fmt.Sprintf(`{"model":"m","prompt":"hello %d"}`, i)))
				d, err := p.Router.Schedule(context.Background(), r, snap, snap.Endpoints)
				if err != nil {
					t.Fatal(err)
				}
				got := ""
				if len(d.Prefill) > 0 {
					got = d.Prefill[0].Name
				}
				for _, e := range append(d.Prefill, d.Destination...) {
					if e.Revision != d.Destination[0].Revision {
						t.Fatalf("decode pick %s with %s of revision %q", d.Destination[0].Name, e.Name, e.Revision)
					}
				}
				if tc.wantPrefill == "*" {
					if len(d.Prefill) == 0 {
						t.Fatalf("decode pick %s served without a prefill pod", d.Destination[0].Name)
					}
				} else if d.Destination[0].Name != "decode-b" || got != tc.wantPrefill {
					t.Fatalf("destination %s prefill %q, want decode-b with %q", d.Destination[0].Name, got, tc.wantPrefill)
				}
				if d.Trace.Unpaired[prefillA.Key()] == "" && d.Trace.Unpaired[prefillB.Key()] == "" || !strings.Contains(strings.Join(d.Trace.Steps, ","), pd.StepPairMatchUnpaired) {
					t.Fatalf("trace steps %v unpaired %v", d.Trace.Steps, d.Trace.Unpaired)
				}
				if d.Lifecycle != nil {
					d.Lifecycle.Done(nil)
				}
			}
		})
	}
}
