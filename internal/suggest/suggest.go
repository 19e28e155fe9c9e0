// Package suggest owns the "did you mean" of a mistyped name (a flag, an environment variable,
// a label value): the known name nearest by edit distance. It imports nothing of Tandem's, so
// every package that reads names from users can use it.
package suggest

// Nearest is the name in known closest to name by edit distance (letters inserted, removed or
// changed), or "" when none is within a third of name's letters (two for names of three to eight
// letters, one for shorter): the "did you mean" of a mistyped flag or environment variable.
func Nearest(name string, known []string) string {
	best, bestD := "", max(len(name)/3, min(len(name)/3+1, 2))+1
	for _, k := range known {
		if d := editDistance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
