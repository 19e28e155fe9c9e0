// Package envoy is a small ext_proc client that speaks to an Endpoint Picker the way
// Envoy's ext_proc filter does with the processing mode Gateway API Inference Extension
// gateways use: request headers SEND, request and response bodies FULL_DUPLEX_STREAMED,
// trailers SEND. Tests and the local gateway use it; it checks the EPP's answers as
// strictly as Envoy does and reports what it got. It must not know Tandem's internals.
package envoy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// Wire names the client reads and writes (the Endpoint Picker Protocol's).
const (
	HeaderDestination   = "x-gateway-destination-endpoint"
	MetadataLB          = "envoy.lb"
	MetadataDestination = "x-gateway-destination-endpoint"
	MetadataServed      = "x-gateway-destination-endpoint-served"
	MetadataSubsetNS    = "envoy.lb.subset_hint"
	MetadataSubsetKey   = "x-gateway-destination-endpoint-subset"
)

// Client holds one gRPC connection to an EPP; open one Stream per HTTP request.
type Client struct {
	conn *grpc.ClientConn
	ext  extprocv3.ExternalProcessorClient
}

// Dial connects to addr ("127.0.0.1:9002"). With secure, it speaks TLS without verifying
// the certificate, as gateways configure it for the EPP's self-signed one.
func Dial(addr string, secure bool) (*Client, error) {
	creds := insecure.NewCredentials()
	if secure {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the EPP's certificate is self-signed by design
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("dialing the EPP at %s: %w", addr, err)
	}
	return &Client{conn: conn, ext: extprocv3.NewExternalProcessorClient(conn)}, nil
}

// Conn is the underlying connection (for the health client, say).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Open starts the ext_proc stream for one HTTP request.
func (c *Client) Open(ctx context.Context) (*Stream, error) {
	pc, err := c.ext.Process(ctx)
	if err != nil {
		return nil, fmt.Errorf("opening an ext_proc stream: %w", err)
	}
	return &Stream{pc: pc, first: true}, nil
}

// Header is one HTTP header; order is kept and names may repeat.
type Header struct{ Key, Value string }

// Stream is one ext_proc stream: the low-level sends and receive, plus the Envoy-like
// sequences Route and Respond built from them.
type Stream struct {
	pc    extprocv3.ExternalProcessor_ProcessClient
	first bool
	// ValueField puts header values in HeaderValue.value instead of raw_value (older
	// clients do); Envoy itself uses raw_value.
	ValueField bool
}

func (s *Stream) headerMap(hs []Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, h := range hs {
		hv := &corev3.HeaderValue{Key: h.Key}
		if s.ValueField {
			hv.Value = h.Value
		} else {
			hv.RawValue = []byte(h.Value)
		}
		m.Headers = append(m.Headers, hv)
	}
	return m
}

// Send sends a raw message. The first message on the stream carries the protocol
// configuration, as Envoy's does.
func (s *Stream) Send(msg *extprocv3.ProcessingRequest) error {
	if s.first {
		s.first = false
		if msg.ProtocolConfig == nil {
			msg.ProtocolConfig = &extprocv3.ProtocolConfiguration{
				RequestBodyMode:  procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED,
				ResponseBodyMode: procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED,
			}
		}
	}
	return s.pc.Send(msg)
}

// Recv receives the next answer.
func (s *Stream) Recv() (*extprocv3.ProcessingResponse, error) { return s.pc.Recv() }

// CloseSend half-closes the stream (Envoy does not; other clients do).
func (s *Stream) CloseSend() error { return s.pc.CloseSend() }

// Subset builds the request metadata for a subset hint: a string is sent as one string
// value, a []string as a list.
func Subset(hint any) (*corev3.Metadata, error) {
	var v *structpb.Value
	switch h := hint.(type) {
	case string:
		v = structpb.NewStringValue(h)
	case []string:
		items := make([]any, len(h))
		for i := range h {
			items[i] = h[i]
		}
		lv, err := structpb.NewList(items)
		if err != nil {
			return nil, err
		}
		v = structpb.NewListValue(lv)
	default:
		return nil, fmt.Errorf("subset hint must be a string or []string, not %T", hint)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataSubsetNS: {Fields: map[string]*structpb.Value{MetadataSubsetKey: v}},
	}}, nil
}

// Served builds response metadata reporting the endpoint that served the request.
func Served(hostPort string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataLB: {Fields: map[string]*structpb.Value{MetadataServed: structpb.NewStringValue(hostPort)}},
	}}
}

// SendRequestHeaders sends the request headers; md carries the subset hint, if any.
func (s *Stream) SendRequestHeaders(hs []Header, endOfStream bool, md *corev3.Metadata) error {
	return s.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: s.headerMap(hs), EndOfStream: endOfStream}},
		MetadataContext: md,
	})
}

// SendRequestBody sends one request body chunk.
func (s *Stream) SendRequestBody(chunk []byte, endOfStream bool) error {
	return s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: endOfStream}}})
}

// SendRequestTrailers sends request trailers (ending the request).
func (s *Stream) SendRequestTrailers(hs []Header) error {
	return s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: s.headerMap(hs)}}})
}

// SendResponseHeaders sends the upstream's response headers with its :status; md carries
// the served endpoint (see Served).
func (s *Stream) SendResponseHeaders(status int, hs []Header, endOfStream bool, md *corev3.Metadata) error {
	all := append([]Header{{":status", strconv.Itoa(status)}}, hs...)
	return s.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: s.headerMap(all), EndOfStream: endOfStream}},
		MetadataContext: md,
	})
}

// SendResponseBody sends one response body chunk.
func (s *Stream) SendResponseBody(chunk []byte, endOfStream bool) error {
	return s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: endOfStream}}})
}

// SendResponseTrailers sends response trailers (ending the response).
func (s *Stream) SendResponseTrailers(hs []Header) error {
	return s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{Trailers: s.headerMap(hs)}}})
}

// Immediate is an ImmediateResponse: the HTTP response the gateway sends without routing.
type Immediate struct {
	Status  int
	Headers map[string]string
	Body    []byte
	Details string
}

func immediate(ir *extprocv3.ImmediateResponse) *Immediate {
	im := &Immediate{Status: int(ir.GetStatus().GetCode()), Headers: map[string]string{}, Body: ir.GetBody(), Details: ir.GetDetails()}
	for _, o := range ir.GetHeaders().GetSetHeaders() {
		im.Headers[strings.ToLower(o.GetHeader().GetKey())] = headerValue(o.GetHeader())
	}
	return im
}

func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// Mutation is what a headers answer asks the gateway to do to the headers.
type Mutation struct {
	Set    map[string]string // lower-case name -> value
	Remove []string
	// Appends lists set headers whose append action would add to, not replace, an existing value.
	Appends []string
}

func mutation(hm *extprocv3.HeaderMutation) Mutation {
	m := Mutation{Set: map[string]string{}, Remove: hm.GetRemoveHeaders()}
	for _, o := range hm.GetSetHeaders() {
		k := strings.ToLower(o.GetHeader().GetKey())
		m.Set[k] = headerValue(o.GetHeader())
		//lint:ignore SA1019 Envoy still honours the deprecated append flag over append_action, so a client must read it.
		legacy := o.GetAppend()
		if (legacy != nil && legacy.GetValue()) || (legacy == nil && o.GetAppendAction() == corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD) {
			m.Appends = append(m.Appends, k)
		}
	}
	return m
}

// Routed is the EPP's complete answer to a request: either Immediate, or the route with
// the request body it hands back.
type Routed struct {
	Immediate *Immediate

	// Destination is the x-gateway-destination-endpoint header set on the request;
	// MetadataDestination the envoy.lb value in the dynamic metadata.
	Destination         string
	MetadataDestination string
	ClearRouteCache     bool
	Headers             Mutation
	// Body is the request body as the EPP streamed it back, in BodyChunks chunks, the
	// largest MaxChunk bytes; BodyEOS says the last chunk carried end_of_stream.
	Body       []byte
	BodyChunks int
	MaxChunk   int
	BodyEOS    bool
	// TrailersAnswered is set when the EPP answered request trailers.
	TrailersAnswered bool
}

// Endpoints splits Destination into its host:port entries (primary first).
func (r *Routed) Endpoints() []string {
	if r.Destination == "" {
		return nil
	}
	return strings.Split(r.Destination, ",")
}

// ErrProtocol marks an answer Envoy would reject.
var ErrProtocol = errors.New("ext_proc protocol error")

func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
}

// Request is one HTTP request to route.
type Request struct {
	Method, Path string
	// Headers are sent after :method and :path (both omitted when empty).
	Headers []Header
	Body    []byte
	// NoBody sends the headers with end_of_stream (a GET): Body must be empty.
	NoBody bool
	// ChunkSize splits Body into chunks of this many bytes (0: one chunk).
	ChunkSize int
	// EmptyFinalChunk ends the body with an extra empty chunk carrying end_of_stream.
	EmptyFinalChunk bool
	// Trailers end the request with trailers instead of end_of_stream on the last chunk.
	Trailers bool
	// HalfClose half-closes the stream after the request.
	HalfClose bool
	// Subset is the subset hint (string or []string), nil for none.
	Subset any
}

// SendRequest sends a whole request the way Envoy does in FULL_DUPLEX_STREAMED mode:
// headers, then every body chunk without waiting for an answer.
func (s *Stream) SendRequest(r Request) error {
	var hs []Header
	if r.Method != "" {
		hs = append(hs, Header{":method", r.Method})
	}
	if r.Path != "" {
		hs = append(hs, Header{":path", r.Path})
	}
	hs = append(hs, r.Headers...)
	var md *corev3.Metadata
	if r.Subset != nil {
		var err error
		if md, err = Subset(r.Subset); err != nil {
			return err
		}
	}
	if r.NoBody {
		if len(r.Body) > 0 {
			return errors.New("a request with NoBody cannot carry a body")
		}
		if err := s.SendRequestHeaders(hs, true, md); err != nil {
			return err
		}
	} else {
		if err := s.SendRequestHeaders(hs, false, md); err != nil {
			return err
		}
		if err := s.sendChunks(r); err != nil {
			return err
		}
	}
	if r.HalfClose {
		return s.CloseSend()
	}
	return nil
}

func (s *Stream) sendChunks(r Request) error {
	size := r.ChunkSize
	if size <= 0 {
		size = max(len(r.Body), 1)
	}
	body := r.Body
	lastEOS := !r.Trailers && !r.EmptyFinalChunk
	for first := true; first || len(body) > 0; first = false {
		n := min(size, len(body))
		if err := s.SendRequestBody(body[:n], lastEOS && n == len(body)); err != nil {
			return fmt.Errorf("sending a request body chunk: %w", err)
		}
		body = body[n:]
	}
	if r.EmptyFinalChunk {
		if err := s.SendRequestBody(nil, !r.Trailers); err != nil {
			return err
		}
	}
	if r.Trailers {
		return s.SendRequestTrailers(nil)
	}
	return nil
}

// ReadRoute reads the answer to a request sent with SendRequest: an ImmediateResponse, or
// the headers answer then the streamed body until end_of_stream (or the trailers answer
// when trailers were sent). It checks what Envoy checks in this mode: the headers answer
// comes first, body answers are streamed responses, nothing else arrives in between.
func (s *Stream) ReadRoute(r Request) (*Routed, error) {
	out := &Routed{}
	msg, err := s.Recv()
	if err != nil {
		return nil, fmt.Errorf("waiting for the answer to the request headers: %w", err)
	}
	if ir := msg.GetImmediateResponse(); ir != nil {
		out.Immediate = immediate(ir)
		return out, nil
	}
	hr := msg.GetRequestHeaders()
	if hr == nil {
		return nil, protoErr("first answer is %T, want request_headers or immediate_response", msg.GetResponse())
	}
	cr := hr.GetResponse()
	if cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE {
		return nil, protoErr("CONTINUE_AND_REPLACE is not allowed in FULL_DUPLEX_STREAMED mode")
	}
	out.ClearRouteCache = cr.GetClearRouteCache()
	out.Headers = mutation(cr.GetHeaderMutation())
	out.Destination = out.Headers.Set[HeaderDestination]
	if lb := msg.GetDynamicMetadata().GetFields()[MetadataLB]; lb != nil {
		out.MetadataDestination = lb.GetStructValue().GetFields()[MetadataDestination].GetStringValue()
	}
	if r.NoBody {
		return out, nil
	}
	for !out.BodyEOS {
		msg, err := s.Recv()
		if err != nil {
			return nil, fmt.Errorf("waiting for request body answers (%d so far): %w", out.BodyChunks, err)
		}
		if r.Trailers && msg.GetRequestTrailers() != nil {
			out.TrailersAnswered = true
			return out, nil
		}
		if ir := msg.GetImmediateResponse(); ir != nil {
			return nil, protoErr("immediate_response after the headers were answered")
		}
		br := msg.GetRequestBody()
		if br == nil {
			return nil, protoErr("got %T while streaming the request body back", msg.GetResponse())
		}
		sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return nil, protoErr("request body answer without a streamed_response body mutation (required in FULL_DUPLEX_STREAMED)")
		}
		out.Body = append(out.Body, sr.GetBody()...)
		out.BodyChunks++
		out.MaxChunk = max(out.MaxChunk, len(sr.GetBody()))
		out.BodyEOS = sr.GetEndOfStream()
	}
	if r.Trailers {
		return nil, protoErr("end_of_stream on the body answer although the request ended with trailers")
	}
	return out, nil
}

// Route opens a stream, sends the request and reads the route. The stream stays open
// for the response phase (Respond); the caller ends it by cancelling ctx.
func (c *Client) Route(ctx context.Context, r Request) (*Stream, *Routed, error) {
	s, err := c.Open(ctx)
	if err != nil {
		return nil, nil, err
	}
	// io.EOF from a send is gRPC saying the server ended the stream (an EPP that answered the
	// headers at once, say with a 429, need not read the body): the answer is read, as Envoy
	// reads it.
	if err := s.SendRequest(r); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	routed, err := s.ReadRoute(r)
	return s, routed, err
}

// Response is the upstream's response to pass through the EPP.
type Response struct {
	Status  int
	Headers []Header
	// Served is reported as envoy.lb / x-gateway-destination-endpoint-served ("" for none).
	Served string
	Chunks [][]byte
	// Trailers end the response with trailers instead of end_of_stream on the last chunk.
	Trailers bool
}

// Answered is what the EPP did to a response.
type Answered struct {
	Headers Mutation
	Chunks  [][]byte // each body chunk as handed back, in order
}

// Respond passes a response through the EPP as Envoy does, one message at a time: each
// body chunk's answer must arrive before the next chunk is sent, so an EPP that holds a
// chunk back fails here instead of passing.
func (s *Stream) Respond(resp Response) (*Answered, error) {
	var md *corev3.Metadata
	if resp.Served != "" {
		md = Served(resp.Served)
	}
	noBody := len(resp.Chunks) == 0 && !resp.Trailers
	if err := s.SendResponseHeaders(resp.Status, resp.Headers, noBody, md); err != nil {
		return nil, err
	}
	msg, err := s.Recv()
	if err != nil {
		return nil, fmt.Errorf("waiting for the answer to the response headers: %w", err)
	}
	hr := msg.GetResponseHeaders()
	if hr == nil {
		return nil, protoErr("got %T, want response_headers", msg.GetResponse())
	}
	out := &Answered{Headers: mutation(hr.GetResponse().GetHeaderMutation())}
	for i, chunk := range resp.Chunks {
		eos := i == len(resp.Chunks)-1 && !resp.Trailers
		if err := s.SendResponseBody(chunk, eos); err != nil {
			return nil, err
		}
		msg, err := s.Recv()
		if err != nil {
			return nil, fmt.Errorf("waiting for the answer to response chunk %d: %w", i, err)
		}
		sr := msg.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return nil, protoErr("response chunk %d answered with %T, want a streamed_response body mutation", i, msg.GetResponse())
		}
		if sr.GetEndOfStream() != eos {
			return nil, protoErr("response chunk %d answered with end_of_stream=%v, want %v", i, sr.GetEndOfStream(), eos)
		}
		out.Chunks = append(out.Chunks, sr.GetBody())
	}
	if resp.Trailers {
		if err := s.SendResponseTrailers(nil); err != nil {
			return nil, err
		}
		msg, err := s.Recv()
		if err != nil {
			return nil, fmt.Errorf("waiting for the answer to response trailers: %w", err)
		}
		if msg.GetResponseTrailers() == nil {
			return nil, protoErr("got %T, want response_trailers", msg.GetResponse())
		}
	}
	return out, nil
}

// Headers builds a header list from name, value pairs: Headers(":method", "GET", "x-a", "1").
func Headers(kv ...string) []Header {
	hs := make([]Header, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		hs = append(hs, Header{Key: kv[i], Value: kv[i+1]})
	}
	return hs
}
