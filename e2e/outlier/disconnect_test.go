package outliere2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tandem-epp/tandem/internal/gateway"
)

// Clients that disconnect before the first token (users pressing "stop") are the caller's
// ending, in either of the orders a gateway ends the ext_proc stream (a plain reset, or
// Envoy's half-close then reset): twelve of them, each routed to a decode pod that has not
// answered yet, eject and demote nothing, and every tracker and ledger charge goes back to 0.
func TestClientDisconnectsBeforeFirstToken(t *testing.T) {
	for _, end := range []string{gateway.EndReset, gateway.EndEnvoy} {
		t.Run(end, func(t *testing.T) {
			s := newStack(t, stackOptions{source: fileSource, streamEnd: end}, pdPods("a", "b")...)
			decodes := []string{"decode-a", "decode-b"}
			routed := func() int {
				n := 0
				for _, d := range decodes {
					n += s.pods[d].received()
				}
				return n
			}
			for _, d := range decodes {
				s.pods[d].faults(`{"hang_before_first_token":true}`)
			}
			const disconnects = 12
			for i := range disconnects {
				before := routed()
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.gwURL+"/v1/chat/completions", bytes.NewReader(chatBody(i)))
				req.Header.Set("Content-Type", "application/json")
				errc := make(chan error, 1)
				go func() {
					resp, err := s.client.Do(req)
					if err == nil {
						resp.Body.Close()
						err = fmt.Errorf("answered %s before the client left", resp.Status)
					}
					errc <- err
				}()
				eventually(t, "the request to reach a decode pod", func() (bool, string) {
					n := routed()
					return n > before, fmt.Sprintf("%d requests on the decode pods", n)
				})
				cancel() // the client disconnects: no response headers yet
				if err := <-errc; ctx.Err() == nil || err == nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			eventually(t, "every tracker and ledger charge released", func() (bool, string) {
				h := s.held()
				return h == "", h
			})
			ejected, demoted := 0, 0
			for _, name := range s.order {
				st := s.tandem.Health().Status(s.key(name))
				bad := false
				if st.Ejected || st.Ejections > 0 {
					ejected++
					bad = true
				}
				if st.RecentFailure || st.Consecutive5xx > 0 || st.ConsGateway > 0 {
					demoted++
					bad = true
				}
				if bad {
					t.Errorf("%s after %d disconnects: %+v, want untouched", name, disconnects, st)
				}
			}
			result(t, "disconnects_"+end, disconnects)
			result(t, "ejected_"+end, ejected)
			result(t, "demoted_"+end, demoted)
			for _, d := range decodes {
				s.pods[d].faults("")
			}
			// The pods still serve: a fresh request is answered.
			resp, err := s.client.Post(s.gwURL+"/v1/chat/completions", "application/json", bytes.NewReader(chatBody(99)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("after the disconnects: %s", resp.Status)
			}
		})
	}
}

// Clients that close their connection as soon as they have read a stream's "data: [DONE]"
// (before the gateway has passed on the end of the upstream body) had every request
// complete: none counts as a failed request (gateway_request_model_fail_total), none counts
// against a pod, and every charge is released.
func TestClientClosesRightAfterDone(t *testing.T) {
	for _, end := range []string{gateway.EndReset, gateway.EndEnvoy} {
		t.Run(end, func(t *testing.T) {
			s := newStack(t, stackOptions{source: fileSource, streamEnd: end}, pdPods("a", "b")...)
			const requests = 20
			for i := range requests {
				body := bytes.Replace(chatBody(i), []byte(`"max_tokens":24`), []byte(`"max_tokens":24,"stream":true`), 1)
				req, _ := http.NewRequest(http.MethodPost, s.gwURL+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := s.client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != http.StatusOK {
					resp.Body.Close()
					t.Fatalf("request %d: %s", i, resp.Status)
				}
				sc := bufio.NewScanner(resp.Body)
				done := false
				for !done && sc.Scan() {
					done = strings.TrimSpace(sc.Text()) == "data: [DONE]"
				}
				resp.Body.Close() // before the chunked body's end was read: the connection closes
				if !done {
					t.Fatalf("request %d: the stream ended without data: [DONE]: %v", i, sc.Err())
				}
			}
			eventually(t, "every tracker and ledger charge released", func() (bool, string) {
				h := s.held()
				return h == "", h
			})
			failed := s.counter("gateway_request_model_fail_total", nil)
			result(t, "requests_closed_after_done_"+end, requests)
			result(t, "counted_failed_"+end, failed)
			if failed != 0 {
				t.Errorf("%v of %d complete streams counted as failed requests", failed, requests)
			}
			for _, name := range s.order {
				if st := s.tandem.Health().Status(s.key(name)); st.Ejected || st.RecentFailure || st.Consecutive5xx > 0 || st.ConsGateway > 0 {
					t.Errorf("%s: %+v, want untouched", name, st)
				}
			}
		})
	}
}
