// Package apierror owns the errors Tandem answers clients with: an HTTP status, an
// OpenAI-style JSON body and the x-error-* headers the seed names. Every layer returns
// these instead of aborting the gRPC stream; the ext_proc server renders them.
package apierror

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Headers the seed uses to mark a gateway-generated failure.
const (
	HeaderRouting   = "x-error-routing"
	HeaderPDPrefill = "x-error-pd-prefill"
	HeaderPDDecode  = "x-error-pd-decode"
)

// Error is a request-level failure with the status and headers the client receives.
type Error struct {
	Status  int    // HTTP status code
	Type    string // OpenAI error type, e.g. "invalid_request_error"
	Param   string // the request field at fault, if any
	Message string // what went wrong and how to fix it
	// Header is the x-error-* header set to "true" (HeaderRouting unless stated).
	Header string
	// Reason is a short, bounded label for metrics (e.g. "no_endpoint", "bad_body").
	Reason string
	// Class, when set, refines Reason with a bounded sub-kind that metrics carry in a label of
	// its own (a PD prefill failure's class: "timeout", "http_status", …).
	Class string
	// RetryAfter, when positive, is sent as the Retry-After header (seconds): the request was
	// refused for load, not for what it says, and the same request may succeed later.
	RetryAfter int
}

func (e *Error) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%d %s: %s (field %q)", e.Status, e.Reason, e.Message, e.Param)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Reason, e.Message)
}

// Body renders the OpenAI-style JSON error body.
func (e *Error) Body() []byte {
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}
	in := inner{Message: e.Message, Type: e.Type, Code: e.Status}
	if e.Param != "" {
		in.Param = &e.Param
	}
	b, _ := json.Marshal(struct {
		Error inner `json:"error"`
	}{in})
	return b
}

// ErrorHeader is the x-error-* header to set, defaulting to x-error-routing.
func (e *Error) ErrorHeader() string {
	if e.Header == "" {
		return HeaderRouting
	}
	return e.Header
}

// BadRequest is a 400 naming the field at fault.
func BadRequest(reason, param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param,
		Message: fmt.Sprintf(format, args...), Reason: reason}
}

// TooLarge is a 413 for a body above the configured limit.
func TooLarge(limit int) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Message: fmt.Sprintf("request body exceeds the %d-byte limit; send a smaller body or raise --max-body-bytes", limit),
		Reason:  "body_too_large"}
}

// Reasons of the admission refusals (bounded metric labels).
const (
	ReasonTooManyStreams = "too_many_streams"
	ReasonBodyBudget     = "body_budget_exhausted"
	ReasonBodyTimeout    = "body_timeout"
	ReasonPanic          = "internal_panic"
)

// TooManyStreams is a 429: the EPP already holds its limit of open requests.
func TooManyStreams(limit int) *Error {
	return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", RetryAfter: 1, Reason: ReasonTooManyStreams,
		Message: fmt.Sprintf("the gateway's endpoint picker is handling its limit of %d requests at once; retry shortly (operators: raise --max-streams or add EPP replicas)", limit)}
}

// BodyBudget is a 503: the request bodies the EPP holds while they arrive already fill its
// memory budget for them.
func BodyBudget(budget int64) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", RetryAfter: 1, Reason: ReasonBodyBudget,
		Message: fmt.Sprintf("the gateway's endpoint picker is receiving its limit of %d bytes of request bodies at once; retry shortly (operators: raise --max-buffered-body-bytes or add EPP replicas)", budget)}
}

// BodyTimeout is a 408: the request body did not arrive in time.
func BodyTimeout(limit time.Duration) *Error {
	return &Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Reason: ReasonBodyTimeout,
		Message: fmt.Sprintf("the request body did not arrive within %s; send it faster (operators: --request-body-timeout)", limit)}
}

// Panic is the 500 a request gets when Tandem failed on a bug while handling it (the stack is
// logged); no part of the request is blamed.
func Panic() *Error {
	return Internal(ReasonPanic, "the gateway's endpoint picker failed while handling this request (an internal error, logged); retry it")
}

// Unavailable is a 503: no endpoint can serve the request.
func Unavailable(reason, format string, args ...any) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable",
		Message: fmt.Sprintf(format, args...), Reason: reason}
}

// Internal is a 500 for a failure inside Tandem.
func Internal(reason, format string, args ...any) *Error {
	return &Error{Status: http.StatusInternalServerError, Type: "internal_error",
		Message: fmt.Sprintf(format, args...), Reason: reason}
}

// From returns err as an *Error, wrapping anything else as a 503 "routing_failed".
func From(err error) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	return Unavailable("routing_failed", "%v", err)
}
