package redisledger

import (
	"math"
	"testing"
	"time"
)

// Every parser of a value read from Redis: whatever the bytes, it does not panic, and what it
// accepts is finite and inside its documented bound.

func FuzzParseValue(f *testing.F) {
	for _, s := range []string{"512,3,1700000000.5", "+Inf,1,0", "NaN,1,0", "1e300,1,0", "1,-1,0", "1,1,-Inf", ",,", "1,2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tokens, count, sumAt, ok := parseValue(s)
		if !ok {
			return
		}
		if !(tokens >= 0 && tokens <= maxLedgerTokens) || count < 0 || count > maxSignalValue || math.IsNaN(sumAt) || math.IsInf(sumAt, 0) {
			t.Fatalf("parseValue(%q) accepted %v %v %v", s, tokens, count, sumAt)
		}
	})
}

func FuzzParseVector(f *testing.F) {
	for _, s := range []string{"1,2,3,4", "+Inf", "NaN,1", "1e300", "-1", "", "1,,2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := parseVector(s)
		if !ok {
			return
		}
		for _, x := range v {
			if !(x >= 0 && x <= maxSignalValue) {
				t.Fatalf("parseVector(%q) accepted %v", s, v)
			}
		}
	})
}

func FuzzParseBusyUntil(f *testing.F) {
	const rsec = 1_700_000_000.25
	for _, s := range []string{"1700000001.5", "inf", "-inf", "nan", "NaN", "1e300", "-1e300", "0", "1700003600.25", "0x1p30", "1_7"} {
		f.Add(s, rsec)
	}
	f.Fuzz(func(t *testing.T, s string, now float64) {
		ahead, ok := parseBusyUntil(s, now)
		if ok && !(ahead >= -maxPrefillAhead && ahead <= maxPrefillAhead) {
			t.Fatalf("parseBusyUntil(%q, %v) accepted %v", s, now, ahead)
		}
	})
}

func FuzzParseLive(f *testing.F) {
	f.Add("1700000000", "250000", int64(2), "a", "1700000000250", "b", "inf")
	f.Add("1700000000", "999999", int64(1), "a", "-inf", "b", "nan")
	f.Add("x", "-1", int64(-5), "", "", "", "")
	f.Fuzz(func(t *testing.T, sec, usec string, n int64, id1, s1, id2, s2 string) {
		reply := []any{sec, usec, n, []any{id1, s1, id2, s2}}
		r, err := parseLive(reply, time.Second)
		if err != nil {
			return
		}
		if r.now.Unix() <= 0 || r.future < 0 || r.unread < 0 || r.future > len(r.live) || len(r.live) > 2 {
			t.Fatalf("parseLive(%v) = %+v", reply, r)
		}
	})
}
