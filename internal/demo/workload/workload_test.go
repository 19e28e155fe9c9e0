package workload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/traces"
)

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadWorkload(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, traces.AzureConv, "TIMESTAMP,ContextTokens,GeneratedTokens\n"+
		"2023-11-16 18:15:46.0000000,100,10\n"+
		"2023-11-16 18:15:47.0000000,5000,400\n"+
		"2023-11-16 18:15:50.0000000,300,5\n")
	writeFile(t, dir, traces.AzureCode, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,700,8\n")
	writeFile(t, dir, traces.Mooncake, ""+
		`{"timestamp": 0, "input_length": 1200, "output_length": 3, "hash_ids": [1, 2, 3]}`+"\n"+
		`{"timestamp": 10, "input_length": 50, "output_length": 3, "hash_ids": [7]}`+"\n"+
		`{"timestamp": 40, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 9]}`+"\n")

	reqs, err := Load(os.DirFS(dir), Mix{Conv: 3, Code: 1, Mooncake: 5, Window: 10 * time.Second, MaxPromptTokens: 4096, MaxOutputTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		src            string
		at             time.Duration
		prompt, output int
	}
	var got []row
	for _, r := range reqs {
		got = append(got, row{r.Source, r.At, r.PromptTokens, r.OutputTokens})
		if len(r.Prompt) != r.PromptTokens*BytesPerToken {
			t.Errorf("%s: prompt of %d bytes for %d tokens, want 4 bytes a token", r.Source, len(r.Prompt), r.PromptTokens)
		}
	}
	// Each trace spans the window: conv arrivals 0s, 1s, 4s of 4s → 0, 2.5s, 10s; the lone
	// code request sits at 0; Mooncake keeps only the two requests sharing block 1 (0, 40ms).
	want := []row{
		{"azure-llm-2023-conv", 0, 100, 10}, {"azure-llm-2023-code", 0, 700, 8}, {"mooncake-synthetic", 0, 1200, 3},
		{"azure-llm-2023-conv", 2500 * time.Millisecond, 4096, 256},
		{"azure-llm-2023-conv", 10 * time.Second, 300, 5}, {"mooncake-synthetic", 10 * time.Second, 1100, 3},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d requests %v, want %v", len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// Mooncake requests share exactly their common blocks (1, 2): 2 × 512 tokens × 4 bytes.
	a, b := reqs[2].Prompt, reqs[5].Prompt
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	if lo := 2 * mooncakeBlockTokens * BytesPerToken; common < lo || common > lo+16 {
		t.Errorf("shared prefix %d bytes, want about %d (blocks 1 and 2)", common, lo)
	}
	if strings.HasPrefix(reqs[0].Prompt[:64], reqs[4].Prompt[:64]) {
		t.Errorf("Azure prompts share a prefix; they must be unique")
	}
}

func TestLoadWorkloadErrors(t *testing.T) {
	cases := []struct{ name, file, content, want string }{
		{"bad header", traces.AzureConv, "time,a,b\n", "want TIMESTAMP,ContextTokens,GeneratedTokens"},
		{"bad number", traces.AzureConv, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,x,1\n", "line 2: ContextTokens"},
		{"bad json", traces.Mooncake, "{nope\n", "line 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, c.file, c.content)
			m := Mix{Window: time.Second}
			if c.file == traces.AzureConv {
				m.Conv = 1
			} else {
				m.Mooncake = 1
			}
			_, err := Load(os.DirFS(dir), m)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
	if _, err := Load(os.DirFS(t.TempDir()), Mix{Code: 1}); err == nil || !strings.Contains(err.Error(), "--data") {
		t.Errorf("missing file: err = %v, want a hint about --data", err)
	}
}
