// Package extproc owns the Endpoint Picker Protocol over Envoy ext_proc: the per-stream
// state machine (headers → body chunks → decide → answers → response pass-through), the
// candidate set (subset hint, conformance test selection), header hygiene, and rendering
// request-level errors as ImmediateResponses. It must not schedule (picker does) nor
// listen on sockets (serving does).
package extproc
