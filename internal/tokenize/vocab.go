package tokenize

import (
	"fmt"
	"sync"

	loader "github.com/pkoukk/tiktoken-go-loader"
)

// vocabFile is cl100k_base's rank file as the offline loader names it.
const vocabFile = "cl100k_base.tiktoken"

var (
	vocabOnce sync.Once
	loaded    *vocabulary
	vocabErr  error
)

// vocabulary is cl100k_base's mergeable ranks (token bytes → rank). Tokens of up to seven
// bytes, most of them and nearly every pair a merge looks up, are keyed by their bytes packed
// in an integer: hashing a uint64 is cheaper than hashing a string.
type vocabulary struct {
	short map[uint64]int32
	long  map[string]int32
}

const maxPacked = 7

func pack(s string) uint64 {
	k := uint64(len(s)) << 56
	for i := 0; i < len(s); i++ {
		k |= uint64(s[i]) << (8 * i)
	}
	return k
}

// rank is the rank of the token s, if s is one.
func (v *vocabulary) rank(s string) (int32, bool) {
	if len(s) <= maxPacked {
		r, ok := v.short[pack(s)]
		return r, ok
	}
	r, ok := v.long[s]
	return r, ok
}

// vocab returns the vocabulary, loaded once: about 100k entries, some 100 ms and 10 MiB the
// first time.
func vocab() (*vocabulary, error) {
	vocabOnce.Do(func() {
		var ranks map[string]int
		ranks, vocabErr = loader.NewOfflineLoader().LoadTiktokenBpe(vocabFile)
		if vocabErr == nil && len(ranks) == 0 {
			vocabErr = fmt.Errorf("%s is empty", vocabFile)
		}
		if vocabErr != nil {
			vocabErr = fmt.Errorf("tokenize: loading %s: %w", vocabFile, vocabErr)
			return
		}
		v := &vocabulary{short: map[uint64]int32{}, long: map[string]int32{}}
		for tok, r := range ranks {
			if len(tok) <= maxPacked {
				v.short[pack(tok)] = int32(r)
			} else {
				v.long[tok] = int32(r)
			}
		}
		loaded = v
	})
	return loaded, vocabErr
}

// Load loads the vocabulary now (it is loaded on first use otherwise); call it at start-up so
// the first request that needs a count does not pay for it.
func Load() error {
	_, err := vocab()
	return err
}
