package prefix

import (
	"strings"
	"testing"
)

// TestHashHead: with 128-token blocks (512 bytes) the first block is 8 sub-blocks of 64 bytes.
// Worked by hand: 300 bytes make 4 sub-blocks; 1500 bytes make 8 sub-blocks and 1 block (988
// bytes left, one whole 512-byte block). Two texts sharing their first 300 bytes share their
// first 4 hashes and no more.
func TestHashHead(t *testing.T) {
	split := HeadSplit(128)
	if split != 8 || HeadSplit(4) != 1 || HeadSplit(31) != 1 || HeadSplit(32) != 2 {
		t.Fatalf("splits %d %d %d %d", split, HeadSplit(4), HeadSplit(31), HeadSplit(32))
	}
	short, head := HashHead(nil, strings.Repeat("s", 300), BlockBytes(128), split)
	if len(short) != 4 || head != 4 {
		t.Errorf("300 bytes: %d hashes, head %d; want 4, 4", len(short), head)
	}
	shared := strings.Repeat("s", 300)
	a, headA := HashHead(nil, shared+strings.Repeat("a", 1200), BlockBytes(128), split)
	b, _ := HashHead(nil, shared+strings.Repeat("b", 1200), BlockBytes(128), split)
	if len(a) != 9 || headA != 8 {
		t.Fatalf("1500 bytes: %d hashes, head %d; want 9, 8", len(a), headA)
	}
	common := 0
	for common < len(a) && a[common] == b[common] {
		common++
	}
	if common != 4 || a[3] != short[3] {
		t.Errorf("texts sharing 300 bytes share %d hashes, want 4", common)
	}
	plain, h := HashHead(nil, strings.Repeat("x", 1500), BlockBytes(4), HeadSplit(4))
	if h != 0 || len(plain) != len(Hash(nil, strings.Repeat("x", 1500), BlockBytes(4))) {
		t.Errorf("split 1 is Hash: %d hashes, head %d", len(plain), h)
	}
}

// TestHeadPct: each sub-block weighs 1/8 of a block. Of 9 hashes (8 sub-blocks, 1 block, total
// weight 2): 4 matched are 0.5/2 = 25 %, 8 are 50 %, all 100 %; a short prompt of 4 sub-blocks
// matched whole is 100 %; without a head it is n/total.
func TestHeadPct(t *testing.T) {
	for _, c := range []struct {
		n, head, split, total int
		want                  float64
	}{
		{4, 8, 8, 9, 25}, {8, 8, 8, 9, 50}, {9, 8, 8, 9, 100}, {0, 8, 8, 9, 0},
		{4, 4, 8, 4, 100}, {2, 4, 8, 4, 50},
		{3, 0, 1, 12, 25},
	} {
		if got := HeadPct(c.n, c.head, c.split, c.total); got != c.want {
			t.Errorf("HeadPct(%d, %d, %d, %d) = %v, want %v", c.n, c.head, c.split, c.total, got, c.want)
		}
	}
}
