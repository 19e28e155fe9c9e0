// Package prefix owns the prefix index: which endpoints recently served which prompt
// prefixes, as chained hashes of fixed-size prompt blocks, per model, in bounded memory.
// Scorers ask it for each endpoint's match percentage; the picker warms it after a pick.
// It must not score or pick, and it holds no request state.
package prefix
