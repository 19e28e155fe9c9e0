// Package tokenize counts prompt tokens with OpenAI's cl100k_base BPE (the tiktoken encoding
// AIBrix counts bucket lengths with), from the vocabulary github.com/pkoukk/tiktoken-go-loader
// embeds: nothing is fetched at run time. It counts only: a scanner equivalent to cl100k's
// pre-tokenizer pattern and a rank-ordered byte-pair merge per piece, so it can stop as soon as
// a count passes the limit a decision needs, and costs a fraction of tiktoken-go's regexp2
// encoder (which tests use as the reference). It must not route or hold request state beyond
// one Length.
package tokenize
