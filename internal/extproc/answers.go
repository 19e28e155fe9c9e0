package extproc

import (
	"maps"
	"slices"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tandem-epp/tandem/internal/apierror"
)

// headerOption sets one header, replacing any value the request already carries: the
// default append action would add to a client-sent value instead.
func headerOption(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// headerOptions renders a header map in sorted key order, so answers are deterministic.
func headerOptions(dst []*corev3.HeaderValueOption, h map[string]string) []*corev3.HeaderValueOption {
	for _, k := range slices.Sorted(maps.Keys(h)) {
		dst = append(dst, headerOption(k, h[k]))
	}
	return dst
}

// routeAnswer is the deferred answer to the request headers: where to send the request.
// prefillTarget, when set (sidecar hand-off), also goes into the envoy.lb metadata next to the
// destination, for gateways whose decode-side proxy reads metadata rather than headers.
func routeAnswer(destination, prefillTarget string, set []*corev3.HeaderValueOption, remove []string) *extprocv3.ProcessingResponse {
	lb := map[string]*structpb.Value{MetadataKeyDestination: structpb.NewStringValue(destination)}
	if prefillTarget != "" {
		lb[MetadataKeyPrefiller] = structpb.NewStringValue(prefillTarget)
	}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{
					ClearRouteCache: true,
					HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove},
				},
			},
		},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			MetadataNamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: lb}),
		}},
	}
}

// streamedBody is one FULL_DUPLEX_STREAMED body chunk, request or response direction.
func streamedBody(response bool, chunk []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos},
		}},
	}}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
}

// chunkedBody splits a request body into streamed chunks of at most maxChunkBytes. An empty
// body is still one (empty) chunk, so the gateway sees the end of stream.
func chunkedBody(body []byte, eos bool) []*extprocv3.ProcessingResponse {
	if len(body) == 0 {
		return []*extprocv3.ProcessingResponse{streamedBody(false, nil, eos)}
	}
	var out []*extprocv3.ProcessingResponse
	for len(body) > 0 {
		n := min(len(body), maxChunkBytes)
		out = append(out, streamedBody(false, body[:n], eos && n == len(body)))
		body = body[n:]
	}
	return out
}

// responseHeadersAnswer adds headers to the response the client sees.
func responseHeadersAnswer(set []*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	cr := &extprocv3.CommonResponse{}
	if len(set) > 0 {
		cr.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: set}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: cr},
	}}
}

// trailersAnswer leaves trailers as they are.
func trailersAnswer(response bool) *extprocv3.ProcessingResponse {
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}}
}

// errorAnswer renders a request-level error as the HTTP response the gateway sends at once.
func errorAnswer(e *apierror.Error) *extprocv3.ProcessingResponse {
	body := e.Body()
	set := []*corev3.HeaderValueOption{
		headerOption("content-type", "application/json"),
		headerOption(e.ErrorHeader(), "true"),
	}
	if e.RetryAfter > 0 {
		set = append(set, headerOption("retry-after", strconv.Itoa(e.RetryAfter)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    body,
			Details: "tandem_" + e.Reason,
		},
	}}
}
