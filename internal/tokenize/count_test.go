package tokenize

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pkoukk/tiktoken-go"
	loader "github.com/pkoukk/tiktoken-go-loader"
)

var (
	refOnce sync.Once
	ref     *tiktoken.Tiktoken
)

// reference is tiktoken-go's cl100k_base encoder with the same offline vocabulary: the counts
// AIBrix's gateway computes.
func reference(t testing.TB) *tiktoken.Tiktoken {
	refOnce.Do(func() {
		tiktoken.SetBpeLoader(loader.NewOfflineLoader())
		var err error
		if ref, err = tiktoken.GetEncoding("cl100k_base"); err != nil {
			t.Fatal(err)
		}
	})
	return ref
}

// corpus is text of every kind a prompt carries: prose, code, JSON, scripts with and without
// spaces, emoji, contractions in any case, every kind of whitespace, digits, bytes that are
// not UTF-8.
func corpus(t testing.TB) []string {
	texts := []string{
		"", "a", " ", "\n", "hello world", strings.Repeat("hello ", 200),
		"I'm sure they'll say it's fine; WE'VE SEEN IT, DON'T WORRY. You'RE right, she'D know, I'LL go.",
		"'s 'S 'tis rock'n'roll ''quoted'' '",
		"你好，世界！今天天气很好。我们去公园散步吧，然后去吃饭。", strings.Repeat("東京は日本の首都です。", 40),
		"नमस्ते दुनिया, यह एक परीक्षण है।", "Привет, мир! Это тест.", "مرحبا بالعالم", "안녕하세요 세계",
		"emoji 👩‍👩‍👧‍👦 🇫🇷 ✨🔥 done", "tabs\tand\t\ttabs\r\nwindows\r\n\r\nlines\n\n\n   \n  x",
		"nbsp\u00a0here\u3000ideographic\u2003em\u2028line\u0085nel", "numbers 1234567 3.14159 1e10 ²³ Ⅻ ٣٤٥",
		"   leading and trailing   ", "x  \n  y", "a\u0301e\u0301 combining", "((((nested)))) [] {} <> !!! ??? ...",
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":16,"stream":true}`,
		"func main() {\n\tfmt.Println(\"hi\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n",
		"    def f(self):\n        return {'a': 1, \"b\": [2, 3]}\n",
		strings.Repeat("a", 3000), strings.Repeat(" ", 500) + "x", strings.Repeat("ab", 700),
		"bad \xff\xfe utf8 \xc3 here", "<|endoftext|> special <|fim_prefix|> text",
		"ſ 'ſ K 'K İstanbul ß ǅ",
	}
	// The repository's own docs and code: real prose, markdown and Go.
	for _, glob := range []string{"../../docs/*.md", "../pd/*.go", "../../README.md"} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil {
				texts = append(texts, string(b))
			}
		}
	}
	// Random mixtures of runes from every class.
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("aZ é日本語 \t\n\r'0123٣.,!?😀\u00a0\u3000-_ʼ'sStTdDmMlLrRvVeE")
	for range 300 {
		var b strings.Builder
		for range rng.IntN(80) {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		texts = append(texts, b.String())
	}
	return texts
}

// TestCountsMatchTiktoken: every text of the corpus counts to exactly tiktoken-go's count.
func TestCountsMatchTiktoken(t *testing.T) {
	enc := reference(t)
	for _, text := range corpus(t) {
		want := len(enc.EncodeOrdinary(text))
		got, complete, err := Count(text, 0)
		if err != nil || !complete || got != want {
			t.Errorf("Count(%.60q) = %d (complete %v, %v), tiktoken-go says %d", text, got, complete, err, want)
		}
	}
}

// TestIDsMatchTiktoken: the token ids are tiktoken-go's, four big-endian bytes each.
func TestIDsMatchTiktoken(t *testing.T) {
	enc := reference(t)
	for _, text := range corpus(t) {
		var want []byte
		for _, id := range enc.EncodeOrdinary(text) {
			want = append(want, byte(id>>24), byte(id>>16), byte(id>>8), byte(id))
		}
		got, err := AppendIDs(nil, text)
		if err != nil || string(got) != string(want) {
			t.Errorf("AppendIDs(%.60q): %d bytes (%v), tiktoken-go's ids are %d bytes", text, len(got), err, len(want))
		}
	}
}

// FuzzCountsMatchTiktoken compares any text with tiktoken-go.
func FuzzCountsMatchTiktoken(f *testing.F) {
	for _, s := range corpus(f)[:40] {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 4096 {
			return
		}
		want := len(reference(t).EncodeOrdinary(text))
		if got, _, err := Count(text, 0); err != nil || got != want {
			t.Errorf("Count(%q) = %d (%v), tiktoken-go says %d", text, got, err, want)
		}
	})
}
