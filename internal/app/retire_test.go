package app

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/prefix"
)

// TestPoolChangesRetirePrefixAffinity: the EPP as cmd/epp wires it forgets, in the prefix index,
// a pod that the endpoints file moves to another address under the same name and port (a
// restart), while the pod that stayed keeps its blocks.
func TestPoolChangesRetirePrefixAffinity(t *testing.T) {
	path := writePool(t, pdPool)
	a := startApp(t, "--endpoints-file="+path)
	waitSynced(t, a)
	var decode, prefill string
	for _, e := range a.Store().Load().Endpoints {
		if e.Name == "decode-0" {
			decode = e.Key()
		} else {
			prefill = e.Key()
		}
	}
	hashes := prefix.Hash(nil, strings.Repeat("a shared prompt ", 64), prefix.BlockBytes(16))
	ix := a.Deps().Prefix
	ix.Add("m", hashes, decode)
	ix.Add("m", hashes, prefill)
	held := func() map[string]int {
		out := map[string]int{}
		ix.MatchBlocks("m", hashes, func(k string, n int) { out[k] = n })
		return out
	}
	moved := strings.Replace(pdPool, "address: 127.0.0.1\n  port: 18200", "address: 127.0.0.2\n  port: 18200", 1)
	if err := os.WriteFile(path, []byte(moved), 0o600); err != nil {
		t.Fatal(err)
	}
	if !within(15*time.Second, func() bool { return held()[decode] == 0 }) {
		t.Fatalf("the restarted decode pod still holds %v", held())
	}
	if n := held()[prefill]; n != len(hashes) {
		t.Errorf("the prefill pod that stayed holds %d of %d blocks", n, len(hashes))
	}
}
