// Command extproc measures the whole ext_proc round trip of a routed request — request
// headers, a 4 KiB chat body, the deferred headers answer and the body answer — for Tandem
// and, in the same run and over the same gRPC client and endpoint set, for upstream lwepp's
// handler (gateway-api-inference-extension v1.6.0 pkg/lwepp/handlers) run in-process.
// Rounds alternate between the two so machine noise hits both alike. Run with `make bench-extproc`.
// It is a measurement, not part of Tandem: it must not be imported, and it must not
// favour either side (same client, endpoints and body for both).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	endpoints := flag.Int("endpoints", 64, "endpoints in the pool")
	concurrency := flag.Int("concurrency", 32, "concurrent streams")
	requests := flag.Int("requests", 6000, "requests per system per round")
	rounds := flag.Int("rounds", 4, "alternating rounds")
	bodySize := flag.Int("body-bytes", 4096, "size of the chat body")
	only := flag.String("only", "", "run one system only (tandem or lwepp), e.g. with -cpuprofile")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the measured rounds to this file")
	memprofile := flag.String("memprofile", "", "write an allocation profile of the measured rounds to this file")
	flag.Parse()

	body := chatBody(*bodySize)
	systems := []system{
		{name: "tandem", server: newTandem(*endpoints)},
		{name: "lwepp", server: newLWEPP(*endpoints)},
	}
	lat := map[string][]time.Duration{}
	for i := range systems {
		addr, stop := serve(systems[i].server)
		defer stop()
		systems[i].addr = addr
		run(addr, body, *concurrency, 500) // warm-up
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	for r := 0; r < *rounds; r++ {
		for _, s := range systems {
			if *only != "" && s.name != *only {
				continue
			}
			lat[s.name] = append(lat[s.name], run(s.addr, body, *concurrency, *requests)...)
		}
	}
	fmt.Printf("ext_proc round trip: %d endpoints, concurrency %d, %d-byte chat body, %d requests per system\n",
		*endpoints, *concurrency, len(body), *rounds**requests)
	for _, s := range systems {
		if len(lat[s.name]) == 0 {
			continue
		}
		p := percentiles(lat[s.name])
		fmt.Printf("%-7s p50 %7.1f µs  p90 %7.1f µs  p99 %7.1f µs\n", s.name, p[0], p[1], p[2])
	}
	if *memprofile != "" {
		f, err := os.Create(*memprofile)
		if err != nil {
			fail(err)
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			fail(err)
		}
		f.Close()
	}
	if *only != "" {
		return
	}
	t, l := percentiles(lat["tandem"]), percentiles(lat["lwepp"])
	fmt.Printf("RESULT extproc_p50_us=%.1f\n", t[0])
	fmt.Printf("RESULT extproc_p99_us=%.1f\n", t[2])
	fmt.Printf("RESULT lwepp_p50_us=%.1f\n", l[0])
	fmt.Printf("RESULT lwepp_p99_us=%.1f\n", l[2])
	fmt.Printf("RESULT ratio_p50=%.2f\n", t[0]/l[0])
}

type system struct {
	name   string
	server extprocv3.ExternalProcessorServer
	addr   string
}

func serve(s extprocv3.ExternalProcessorServer) (string, func()) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	g := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(g, s)
	go func() { _ = g.Serve(lis) }()
	return lis.Addr().String(), g.Stop
}

// run sends n requests over `concurrency` connections' worth of streams and returns each
// request's round trip: from sending the request headers to receiving the body answer.
func run(addr string, body []byte, concurrency, n int) []time.Duration {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	out := make([]time.Duration, n)
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				k := i
				i++
				next.Unlock()
				if k >= n {
					return
				}
				d, err := roundTrip(client, body)
				if err != nil {
					fail(err)
				}
				out[k] = d
			}
		}()
	}
	wg.Wait()
	return out
}

func roundTrip(client extprocv3.ExternalProcessorClient, body []byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := client.Process(ctx)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")},
		{Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: ":authority", RawValue: []byte("gateway")},
		{Key: "content-type", RawValue: []byte("application/json")},
		{Key: "content-length", RawValue: []byte(fmt.Sprint(len(body)))},
	}}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}}); err != nil {
		return 0, err
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return 0, err
	}
	gotHeaders := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return 0, fmt.Errorf("recv: %w", err)
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if !hasDestination(r.RequestHeaders) {
				return 0, fmt.Errorf("headers answer without a destination")
			}
			gotHeaders = true
		case *extprocv3.ProcessingResponse_RequestBody:
			if !gotHeaders {
				return 0, fmt.Errorf("body answer before headers answer")
			}
			if sb := r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse(); sb != nil && !sb.EndOfStream {
				continue // more body chunks follow
			}
			d := time.Since(start)
			_ = stream.CloseSend()
			return d, nil
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			return 0, fmt.Errorf("immediate response %v", r.ImmediateResponse.GetStatus())
		}
	}
}

func hasDestination(h *extprocv3.HeadersResponse) bool {
	for _, hv := range h.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if hv.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
			return true
		}
	}
	return false
}

func chatBody(size int) []byte {
	prefix := `{"model":"bench-model","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"`
	suffix := `"}]}`
	fill := size - len(prefix) - len(suffix)
	words := strings.Repeat("lorem ipsum dolor sit amet ", fill/27+1)[:fill]
	return []byte(prefix + words + suffix)
}

func percentiles(d []time.Duration) [3]float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) float64 { return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1e3 }
	return [3]float64{at(0.50), at(0.90), at(0.99)}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-extproc:", err)
	os.Exit(1)
}
