// Package outcome records what happened to every request Tandem routed, per endpoint: when
// its prefill leg ended, when the first response byte arrived, how its chunks were spaced,
// how it ended (status, error). It is the one writer of those facts; the latency models, the
// prediction-error metrics and passive health are its readers. It must not decide anything
// nor keep per-endpoint state of its own: readers aggregate what they need.
//
// Writer: a strategy starts a Route when it decides (Recorder.Start) and the decision's
// lifecycle reports the events (PrefillEnd, Response, Chunk, End; Answered is Response with
// what an answer says of the prefill leg; Transfer, the proof of a PD route's KV transfer,
// rides on End); each is stamped with the
// recorder's clock and handed to every Reader at once, synchronously, so a reader sees the
// events of one route in order.
//
// A process has two recorders, each with one route per request: the strategies' (the
// lifecycles write it, picker.Deps.Outcomes; the latency models read it) and the ext_proc
// server's (it writes what the stream saw, failures classified as Failure; passive health
// reads it). A reader subscribes to one of them, never both.
//
// Reader: implement Observe and Subscribe it. Observe runs on the request path (ext_proc
// stream goroutines, the hand-off): it must be quick and must not block.
package outcome
