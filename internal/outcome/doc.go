// Package outcome records what happened to every request Tandem routed, per endpoint: when
// its prefill leg ended, when the first response byte arrived, how its chunks were spaced,
// how it ended (status, error). It is the one writer of those facts; the latency models, the
// prediction-error metrics and passive health are its readers. It must not decide anything
// nor keep per-endpoint state of its own: readers aggregate what they need.
//
// Writer: a strategy starts a Route when it decides (Recorder.Start) and the decision's
// lifecycle reports the events (PrefillEnd, Response, Chunk, End; Answered is Response with
// what an answer says of the prefill leg; Transfer, the proof of a PD route's KV transfer,
// rides on End); each is stamped with the recorder's clock and handed to every Reader at
// once, synchronously, so a reader sees the events of one route in order.
//
// A process has one recorder and one route per request (picker.Deps.Outcomes, the decision's
// Route). The ext_proc server reports into it, before the lifecycle, what only the stream
// knows: how the prefill leg and the request ended, classified as Failure, and the endpoint
// the gateway says served. The first report of an event wins, so the lifecycle's later one
// changes nothing. It starts the route itself for a decision whose strategy started none.
//
// Reader: implement Observe and Subscribe it. Observe runs on the request path (ext_proc
// stream goroutines, the hand-off): it must be quick and must not block.
package outcome
