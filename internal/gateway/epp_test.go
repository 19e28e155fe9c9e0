package gateway

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// scriptedEPP is a real ext_proc server that behaves like an Endpoint Picker in
// FULL_DUPLEX_STREAMED mode: it defers the request-headers answer until the body ends, then
// answers with the destination and streams the (possibly replaced) body back. Its knobs make
// it misbehave at a chosen phase.
type scriptedEPP struct {
	extprocv3.UnimplementedExternalProcessorServer

	dest        string // header and metadata value
	metaDest    string // metadata value when it must differ from dest ("" = same)
	noDest      bool   // answer without any destination
	plainBody   bool   // answer body chunks without streamed_response (spurious in this mode)
	replaceBody []byte // body sent upstream instead of the client's (nil = echo)
	immediateAt string // "headers", "body", "respHeaders", "respBody"
	abortAt     string // "body" (before the decision), "respBody" (after the response started)
	upperResp   bool   // upper-case response body chunks
	// answerAfter, when set, holds an immediate answer to the request headers until it closes.
	answerAfter <-chan struct{}

	mu  sync.Mutex
	rec []record
}

// record is what one stream showed the EPP.
type record struct {
	headers     map[string]string
	headersEOS  bool
	subset      []string
	body        []byte
	bodyChunks  int
	bodyEOS     bool
	trailers    map[string]string
	served      string
	respStatus  string
	respChunks  int
	respEOS     bool
	respTrailer bool
}

func (e *scriptedEPP) records() []record {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]record(nil), e.rec...)
}

func headerMap(h *corev3.HeaderMap) map[string]string {
	m := map[string]string{}
	for _, v := range h.GetHeaders() {
		m[v.GetKey()] = string(v.GetRawValue())
	}
	return m
}

func set(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
}

func immediate(code typev3.StatusCode, body string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: code},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-epp-error", "yes")}},
			Body:    []byte(body),
		}}}
}

func streamedAnswer(request bool, chunk []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos}}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

func (e *scriptedEPP) decision() *extprocv3.ProcessingResponse {
	hm := &extprocv3.HeaderMutation{
		SetHeaders:    []*corev3.HeaderValueOption{set("x-epp", "routed")},
		RemoveHeaders: []string{"x-secret"},
	}
	m := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: hm, ClearRouteCache: true}}}}
	if e.noDest {
		return m
	}
	hm.SetHeaders = append(hm.SetHeaders, set(destinationKey, e.dest))
	md := e.dest
	if e.metaDest != "" {
		md = e.metaDest
	}
	m.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
		destinationNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			destinationKey: structpb.NewStringValue(md)}})}}
	return m
}

// Process follows the EPP side of the protocol one message at a time.
func (e *scriptedEPP) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var r record
	e.mu.Lock()
	idx := len(e.rec)
	e.rec = append(e.rec, r)
	e.mu.Unlock()
	// publish makes what this stream saw visible before each answer, so a test that has its
	// HTTP response can read it.
	publish := func() {
		e.mu.Lock()
		e.rec[idx] = r
		e.mu.Unlock()
	}
	defer publish()
	srv := publishingStream{stream, publish}
	sendBody := func(trailersFollow bool) error {
		if err := srv.Send(e.decision()); err != nil {
			return err
		}
		body := r.body
		if e.replaceBody != nil {
			body = e.replaceBody
		}
		if e.plainBody {
			return srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
		}
		// Two chunks, to exercise reassembly on the gateway side.
		half := len(body) / 2
		if err := srv.Send(streamedAnswer(true, body[:half], false)); err != nil {
			return err
		}
		return srv.Send(streamedAnswer(true, body[half:], !trailersFollow))
	}
	for {
		req, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch v := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			r.headers = headerMap(v.RequestHeaders.GetHeaders())
			r.headersEOS = v.RequestHeaders.GetEndOfStream()
			if l := req.GetMetadataContext().GetFilterMetadata()[subsetNamespace].GetFields()[subsetKey].GetListValue(); l != nil {
				for _, s := range l.GetValues() {
					r.subset = append(r.subset, s.GetStringValue())
				}
			}
			if e.immediateAt == "headers" {
				if e.answerAfter != nil {
					<-e.answerAfter
				}
				return srv.Send(immediate(typev3.StatusCode_TooManyRequests, "shed"))
			}
			if r.headersEOS {
				if err := srv.Send(e.decision()); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			r.body = append(r.body, v.RequestBody.GetBody()...)
			r.bodyChunks++
			if e.abortAt == "body" {
				return status.Error(codes.Internal, "picker exploded")
			}
			if v.RequestBody.GetEndOfStream() {
				r.bodyEOS = true
				if e.immediateAt == "body" {
					return srv.Send(immediate(typev3.StatusCode_BadRequest, `{"error":"bad body"}`))
				}
				if err := sendBody(false); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			r.trailers = headerMap(v.RequestTrailers.GetTrailers())
			if err := sendBody(true); err != nil {
				return err
			}
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
				RequestTrailers: &extprocv3.TrailersResponse{HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{set("x-epp-trailer", "req")}}}}}); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			r.served = req.GetMetadataContext().GetFilterMetadata()[destinationNamespace].GetFields()[servedKey].GetStringValue()
			r.respStatus = headerMap(v.ResponseHeaders.GetHeaders())[":status"]
			if e.immediateAt == "respHeaders" {
				return srv.Send(immediate(typev3.StatusCode_ServiceUnavailable, "decode pod unhealthy"))
			}
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{set("x-epp-served", r.served)}}}}}}); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			r.respChunks++
			r.respEOS = r.respEOS || v.ResponseBody.GetEndOfStream()
			if e.immediateAt == "respBody" {
				return srv.Send(immediate(typev3.StatusCode_InternalServerError, "too late"))
			}
			if e.abortAt == "respBody" {
				return status.Error(codes.Aborted, "watchdog fired")
			}
			chunk := v.ResponseBody.GetBody()
			if e.upperResp {
				chunk = bytes.ToUpper(chunk)
			}
			if err := srv.Send(streamedAnswer(false, chunk, v.ResponseBody.GetEndOfStream())); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			r.respTrailer = true
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
				ResponseTrailers: &extprocv3.TrailersResponse{HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{set("x-epp-trailer", "resp")}}}}}); err != nil {
				return err
			}
		}
	}
}

type publishingStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	publish func()
}

func (s publishingStream) Send(m *extprocv3.ProcessingResponse) error {
	s.publish()
	return s.ExternalProcessor_ProcessServer.Send(m)
}

// startEPP serves e on 127.0.0.1 (TLS when creds is set) for the test's lifetime.
func startEPP(t *testing.T, e extprocv3.ExternalProcessorServer, creds credentials.TransportCredentials) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(s, e)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// lower maps header names to lower case, joining repeated values with ",".
func lower(m map[string][]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[strings.ToLower(k)] = strings.Join(v, ",")
	}
	return out
}
