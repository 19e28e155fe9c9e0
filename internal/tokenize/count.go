package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// cl100k_base splits text into pieces with this pattern before merging bytes within each piece:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ' '?[^\s\p{L}\p{N}]+[\r\n]* |
//	\s*[\r\n]+ | \s+(?!\S) | \s+
//
// piece returns the end of the piece starting at i, taking the alternatives in that order as a
// backtracking matcher does. \s is unicode.IsSpace, \p{L} unicode.IsLetter, \p{N}
// unicode.IsNumber: the classes regexp2 (tiktoken-go's engine) uses.
func piece(s string, i int) int {
	r0, n0 := decode(s, i)
	// 1. contractions, in any case
	if r0 == '\'' && i+1 < len(s) {
		r1, n1 := decode(s, i+1)
		switch unicode.ToLower(r1) {
		case 's', 't', 'm', 'd':
			return i + 1 + n1
		case 'r', 'v', 'l': // 're, 've, 'll
			if i+1+n1 < len(s) {
				r2, n2 := decode(s, i+1+n1)
				want := 'e'
				if unicode.ToLower(r1) == 'l' {
					want = 'l'
				}
				if unicode.ToLower(r2) == want {
					return i + 1 + n1 + n2
				}
			}
		}
	}
	// 2. an optional non-letter, non-digit, non-newline, then letters
	if isLetter(r0) {
		return letters(s, i+n0)
	}
	if r0 != '\r' && r0 != '\n' && !isNumber(r0) && i+n0 < len(s) {
		if r1, n1 := decode(s, i+n0); isLetter(r1) {
			return letters(s, i+n0+n1)
		}
	}
	// 3. one to three digits
	if isNumber(r0) {
		j := i + n0
		for k := 1; k < 3 && j < len(s); k++ {
			r, n := decode(s, j)
			if !isNumber(r) {
				break
			}
			j += n
		}
		return j
	}
	// 4. an optional space, symbols, then newlines
	j := i
	if r0 == ' ' {
		j++
	}
	if j < len(s) {
		if r, _ := decode(s, j); isOther(r) {
			for j < len(s) {
				r, n := decode(s, j)
				if !isOther(r) {
					break
				}
				j += n
			}
			for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
				j++
			}
			return j
		}
	}
	// r0 is whitespace: every other rune matched an alternative above.
	end, last, lastNL := i, i, -1
	for end < len(s) {
		r, n := decode(s, end)
		if !unicode.IsSpace(r) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = end
		}
		last = end
		end += n
	}
	switch {
	case lastNL >= 0: // 5. whitespace through the last newline
		return lastNL + 1
	case end == len(s) || last == i: // 6. fails on a single space before a non-space; 7. takes it
		return end
	}
	return last // 6. the run but its last character, which leads the next piece
}

func letters(s string, j int) int {
	for j < len(s) {
		if c := s[j]; c < utf8.RuneSelf {
			if asciiClass[c] != classLetter {
				break
			}
			j++
			continue
		}
		r, n := decode(s, j)
		if !isLetter(r) {
			break
		}
		j += n
	}
	return j
}

func decode(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// The classes of ASCII characters, looked up rather than tested on the hot path.
const (
	classOther byte = iota
	classLetter
	classNumber
	classSpace
)

var asciiClass = func() (t [utf8.RuneSelf]byte) {
	for c := range rune(utf8.RuneSelf) {
		switch {
		case unicode.IsLetter(c):
			t[c] = classLetter
		case unicode.IsNumber(c):
			t[c] = classNumber
		case unicode.IsSpace(c):
			t[c] = classSpace
		}
	}
	return t
}()

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classLetter
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classNumber
	}
	return unicode.IsNumber(r)
}

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classOther
	}
	return !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r)
}
