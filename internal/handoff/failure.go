package handoff

import (
	"fmt"
	"net/http"

	"github.com/tandem-epp/tandem/internal/apierror"
)

// FailureClass says why a prefill leg failed, from a bounded set (a metric label).
type FailureClass string

// Failure classes, as the seed names them.
const (
	ClassRequestSetup FailureClass = "request_setup" // the request could not be built
	ClassTimeout      FailureClass = "timeout"       // AIBRIX_PREFILL_REQUEST_TIMEOUT or a network timeout
	ClassCanceled     FailureClass = "canceled"      // the client (or Tandem) cancelled the request
	ClassTransport    FailureClass = "transport"     // connection refused, reset, DNS, ...
	ClassHTTPStatus   FailureClass = "http_status"   // the engine answered something other than 200
	ClassBadResponse  FailureClass = "bad_response"  // 200 with a body that cannot be used
)

// maxMessageBytes bounds the failure text put into the client's error message.
const maxMessageBytes = 256

// Failure is a failed prefill leg.
type Failure struct {
	Class FailureClass
	// EngineStatus is the prefill engine's HTTP status for ClassHTTPStatus, else 0.
	EngineStatus int
	Err          error
}

func (f *Failure) Error() string {
	return fmt.Sprintf("prefill request failed (%s): %v", f.Class, f.Err)
}

func (f *Failure) Unwrap() error { return f.Err }

// ReasonPrefillFailure is the apierror reason of a request its prefill leg failed: the seed's
// (and AIBrix's) gateway_request_model_fail_total status label; the class goes in the class label.
const ReasonPrefillFailure = "pd_prefill_failure"

// Status is what the client receives: the engine's own status when it is an error status
// (400-599), 502 for any other status, and 503 for every other class.
func (f *Failure) Status() int {
	if f.Class == ClassHTTPStatus {
		if f.EngineStatus >= 400 && f.EngineStatus <= 599 {
			return f.EngineStatus
		}
		return http.StatusBadGateway
	}
	return http.StatusServiceUnavailable
}

// APIError is the client's answer: an OpenAI-style error naming the class, marked with
// x-error-pd-prefill so it cannot be mistaken for the decode pod's own error.
func (f *Failure) APIError() *apierror.Error {
	msg := truncate(fmt.Sprint(f.Err), maxMessageBytes)
	typ := "service_unavailable"
	if f.Status() != http.StatusServiceUnavailable {
		typ = "upstream_error"
	}
	return &apierror.Error{Status: f.Status(), Type: typ, Header: apierror.HeaderPDPrefill,
		Message: fmt.Sprintf("prefill request failed (%s): %s", f.Class, msg),
		Reason:  ReasonPrefillFailure, Class: string(f.Class)}
}
