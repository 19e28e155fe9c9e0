package extproc

// The protocol's wire names (headers, metadata namespaces and keys) are defined once, with
// the spec's meaning, in package wire.

// maxChunkBytes bounds each streamed body chunk Tandem sends: some gateways cap a chunk at
// 64 KiB, so stay below it with a margin.
const maxChunkBytes = 62000
