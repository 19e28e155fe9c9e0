package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// The NGINX client: what NGINX Gateway Fabric (v2.6) does for a request to an InferencePool
// backend, rebuilt from its observable behaviour. Two parts:
//
//   - nginx (ServeHTTP in ClientNGINX mode) holds the whole client body, asks the shim over
//     loopback HTTP, and proxies the client's original request to the one host:port the shim
//     returned, or to a random pool pod when the shim answered anything but a 200 carrying the
//     destination header (NGF's map falls back to the pool's upstream: fail-open whatever the
//     pool's failureMode says). A destination that is not one host:port fails the request
//     with 500, as nginx's proxy_pass does ("invalid port in upstream"). Nothing of the EPP's
//     answer but that header is used, and no response reaches the EPP.
//   - Shim is the endpoint-picker shim: it turns the HTTP request into an ext_proc stream.
const (
	// ClientEnvoy (the default) drives the EPP as Envoy's ext_proc filter does.
	ClientEnvoy = "envoy"
	// ClientNGINX drives it as NGINX Gateway Fabric's njs module and endpoint-picker shim do.
	ClientNGINX = "nginx"

	// HeaderEPPHost and HeaderEPPPort tell the shim where the EPP is (NGF's njs module adds
	// them to the client's headers, and the shim forwards them to the EPP with the rest).
	HeaderEPPHost = "X-EPP-Host"
	HeaderEPPPort = "X-EPP-Port"
)

// Shim is an http.Handler behaving as NGINX Gateway Fabric's endpoint-picker shim (v2.6.7):
//
//   - the EPP address comes from the X-EPP-Host and X-EPP-Port headers (400 without them);
//   - one gRPC connection per request (TLS without verification unless Plaintext);
//   - one request_headers message: every HTTP header, names lower-cased, values in `value`
//     (not raw_value), no pseudo-headers (no :path, :method, :authority), end_of_stream false,
//     no protocol configuration, no metadata;
//   - a request without a body is refused (500, after the headers went out); the body goes
//     whole in one request_body message with end_of_stream, then the stream is half-closed;
//   - every answer is read until the EPP ends the stream: an ImmediateResponse becomes that
//     status and body; of a request_headers answer only a set x-gateway-destination-endpoint
//     header is kept, its raw_value copied into the response; everything else (other headers,
//     removals, body mutations, dynamic metadata) is ignored;
//   - a failed stream is a 502; otherwise the answer is a 200.
type Shim struct {
	// Plaintext speaks gRPC without TLS to the EPP (NGF's shim flag for it).
	Plaintext bool
	Logger    logr.Logger
}

// ServeHTTP implements http.Handler.
func (s *Shim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, port := r.Header.Get(HeaderEPPHost), r.Header.Get(HeaderEPPPort)
	if host == "" || port == "" {
		http.Error(w, "missing at least one of required headers: "+HeaderEPPHost+" and "+HeaderEPPPort, http.StatusBadRequest)
		return
	}
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // NGF's shim does not verify the EPP either
	if s.Plaintext {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(net.JoinHostPort(host, port), grpc.WithTransportCredentials(creds))
	if err != nil {
		http.Error(w, "error creating gRPC client: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(r.Context())
	if err != nil {
		http.Error(w, "error opening ext_proc stream: "+err.Error(), http.StatusBadGateway)
		return
	}
	var hs []*corev3.HeaderValue
	for key, values := range r.Header {
		for _, v := range values {
			hs = append(hs, &corev3.HeaderValue{Key: strings.ToLower(key), Value: v})
		}
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}}}); err != nil {
		http.Error(w, "error sending headers: "+err.Error(), http.StatusBadGateway)
		return
	}
	if r.ContentLength == 0 {
		http.Error(w, "error building body request: request body is empty", http.StatusInternalServerError)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "error building body request: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		http.Error(w, "error sending body: "+err.Error(), http.StatusBadGateway)
		return
	}
	if err := stream.CloseSend(); err != nil {
		http.Error(w, "error closing stream: "+err.Error(), http.StatusInternalServerError)
		return
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			http.Error(w, "error receiving from ext_proc: "+err.Error(), http.StatusBadGateway)
			return
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			s.Logger.V(1).Info("immediate response from the EPP", "code", ir.GetStatus().GetCode(), "body", string(ir.GetBody()))
			http.Error(w, string(ir.GetBody()), int(ir.GetStatus().GetCode()))
			return
		}
		for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == destinationKey {
				w.Header().Set(h.GetHeader().GetKey(), string(h.GetHeader().GetRawValue()))
			}
		}
	}
	w.WriteHeader(http.StatusOK)
}

// nginxFront is the nginx side of ClientNGINX: the shim on a loopback listener of its own.
type nginxFront struct {
	shimURL  string
	shimSrv  *http.Server
	client   *http.Client
	eppHost  string
	eppPort  string
	stripped map[string]bool
}

func newNGINXFront(opts Options) (*nginxFront, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("gateway: the NGINX client's shim listener: %w", err)
	}
	srv := &http.Server{Handler: &Shim{Plaintext: !opts.TLS, Logger: opts.Logger}, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	host, port, _ := net.SplitHostPort(opts.EPPAddr)
	f := &nginxFront{shimURL: "http://" + ln.Addr().String(), shimSrv: srv, eppHost: host, eppPort: port,
		client: &http.Client{Timeout: opts.DecisionTimeout}, stripped: map[string]bool{}}
	for _, h := range opts.StripHeaders {
		f.stripped[http.CanonicalHeaderKey(h)] = true
	}
	return f, nil
}

func (f *nginxFront) close() {
	f.client.CloseIdleConnections()
	_ = f.shimSrv.Close()
}

// pick asks the shim as NGF's njs module does (same method, the client's headers plus the EPP
// address, the whole body) and returns the destination header of a 200, else "" and why.
func (f *nginxFront) pick(ctx context.Context, r *http.Request, body []byte) (string, string) {
	req, err := http.NewRequestWithContext(ctx, r.Method, f.shimURL, bytes.NewReader(body))
	if err != nil {
		return "", err.Error()
	}
	for k, vs := range r.Header {
		req.Header[k] = vs
	}
	req.Header.Set(HeaderEPPHost, f.eppHost)
	req.Header.Set(HeaderEPPPort, f.eppPort)
	resp, err := f.client.Do(req)
	if err != nil {
		return "", "ngx.fetch: " + err.Error()
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	endpoint := resp.Header.Get(destinationKey)
	if resp.StatusCode != http.StatusOK || endpoint == "" {
		return "", fmt.Sprintf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return endpoint, ""
}

// serveNGINX runs one request as NGINX Gateway Fabric does.
func (g *Gateway) serveNGINX(w http.ResponseWriter, r *http.Request) {
	log := g.opts.Logger.WithValues("method", r.Method, "path", r.URL.Path)
	body, err := io.ReadAll(r.Body) // nginx reads the whole body before the njs handler runs
	if err != nil {
		gatewayError(w, http.StatusBadRequest, "reading the client body: "+err.Error())
		return
	}
	endpoint, why := g.nginx.pick(r.Context(), r, body)
	if endpoint == "" {
		// NGF's map sends an empty pick to the pool's own upstream (a random pod).
		endpoint = g.opts.DefaultEndpoints[rand.IntN(len(g.opts.DefaultEndpoints))]
		log.Info("no endpoint from the EndpointPicker; a random pool pod serves the request", "reason", why, "endpoint", endpoint)
		w.Header().Set(HeaderNGINXFallback, "true")
	}
	if err := checkEndpoint(endpoint); err != nil {
		// proxy_pass http://$inference_workload_endpoint takes the value as one host:port.
		log.Info("invalid port in upstream", "endpoint", endpoint)
		gatewayError(w, http.StatusInternalServerError, "invalid port in upstream \""+endpoint+"\"")
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+endpoint+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		gatewayError(w, http.StatusInternalServerError, err.Error())
		return
	}
	for k, vs := range r.Header {
		if !g.nginx.stripped[k] && !notForwarded(k) {
			out.Header[k] = vs
		}
	}
	out.Host = r.Host
	resp, err := g.transport.RoundTrip(out)
	if err != nil {
		gatewayError(w, http.StatusBadGateway, "upstream "+endpoint+": "+err.Error())
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		if !notForwarded(k) {
			w.Header()[k] = vs
		}
	}
	w.Header().Set(HeaderServedBy, endpoint)
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, chunkSize)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = http.NewResponseController(w).Flush()
		}
		if err != nil {
			if err != io.EOF {
				panic(http.ErrAbortHandler) // cut the client stream, as nginx does
			}
			return
		}
	}
}

// Response headers of the NGINX client, for tests: which endpoint served, and whether the shim
// gave none so nginx chose a pool pod itself.
const (
	HeaderServedBy      = "X-Gateway-Served-By"
	HeaderNGINXFallback = "X-Gateway-Fallback"
)

func gatewayError(w http.ResponseWriter, code int, reason string) {
	w.Header().Set("X-Gateway-Error", reason)
	http.Error(w, reason, code)
}

// notForwarded: hop-by-hop headers, and Content-Length (net/http sets it from the body).
func notForwarded(k string) bool {
	k = strings.ToLower(k)
	return hopByHop[k] || k == "content-length"
}
