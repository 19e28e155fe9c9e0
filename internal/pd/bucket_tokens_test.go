package pd

import (
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/picker"
)

// TestBucketsCountTokens: bucket boundaries compare the prompt's cl100k_base token count, as
// AIBrix counts it, not the bytes/4 estimate. 200 × "hello " is 1200 bytes: an estimate of 300
// tokens but 201 real ones, so it belongs to the [0, 250] pair, not to the standard pod serving
// 251 and up; 100 × "你好世界，" (1500 bytes, estimate 375) is 600 tokens and goes the other way.
func TestBucketsCountTokens(t *testing.T) {
	h := newHarness(t, gateway(func(p *config.PD) { p.PromptLengthBucketing = true }),
		P("p0", "rs").rng(0, 250), D("d0", "rs").rng(0, 250), C("c0", `"promptLenBucketMinLength": 251`))
	d := h.mustPick(strings.Repeat("hello ", 200))
	if d.Outcome != picker.OutcomePD || first(d.Destination) != "d0" {
		t.Errorf("201 tokens: %s to %v, want the [0, 250] pair", d.Outcome, names(d.Destination))
	}
	d.Lifecycle.Done(nil)

	h = newHarness(t, gateway(func(p *config.PD) { p.PromptLengthBucketing = true }),
		P("p0", "rs").rng(0, 500), D("d0", "rs").rng(0, 500), C("c0", `"promptLenBucketMinLength": 501`))
	d = h.mustPick(strings.Repeat("你好世界，", 100))
	if d.Outcome != picker.OutcomeCombined || first(d.Destination) != "c0" {
		t.Errorf("600 tokens: %s to %v, want the standard pod for 501 and up", d.Outcome, names(d.Destination))
	}
	d.Lifecycle.Done(nil)
}

// TestTiktokenPrefixIndex: AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE=tiktoken cuts prefix blocks from
// the prompt's cl100k_base tokens, not from its bytes. 200 × "hello " is 201 tokens: 12 blocks of
// 16 tokens, where the character tokenizer makes 18 blocks of 64 bytes; the pod that served it
// then matches it in full.
func TestTiktokenPrefixIndex(t *testing.T) {
	for _, tc := range []struct {
		tokenizer string
		blocks    int
	}{{config.TokenizerTiktoken, 12}, {config.TokenizerCharacter, 18}} {
		h := newHarness(t, gateway(func(p *config.PD) { p.PrefixCache.BlockSize, p.PrefixCache.TokenizerType = 16, tc.tokenizer }),
			P("p0", "rs"), D("d0", "rs"))
		d := h.mustPick(strings.Repeat("hello ", 200))
		d.Lifecycle.Done(nil)
		if n := h.deps.Prefix.Len(); n != tc.blocks {
			t.Errorf("%s: the index holds %d blocks, want %d", tc.tokenizer, n, tc.blocks)
		}
	}
}
