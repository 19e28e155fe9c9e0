package extproc

// Headers llm-d's decode-side routing sidecar acts on besides HeaderPrefillerHostPort: it sends
// the encoder and data-parallel legs to the hosts they name. Like the prefill target, a client
// must never choose them (the sidecar would connect wherever the client says), so they are
// removed from every client request.
const (
	HeaderEncoderHostsPorts    = "x-encoder-hosts-ports"
	HeaderDataParallelHostPort = "x-data-parallel-host-port"
)
