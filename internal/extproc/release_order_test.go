package extproc

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/conformance/envoy"
)

// slowDone is a lifecycle whose release takes a while, as a contended ledger's may: it records
// whether Done had finished.
type slowDone struct {
	recLifecycle
	released atomic.Bool
}

func (l *slowDone) Done(err error) {
	time.Sleep(50 * time.Millisecond)
	l.recLifecycle.Done(err)
	l.released.Store(true)
}

// TestRequestReleasedBeforeItsLastAnswer: the decision's lifecycle ends before the answer to
// the response's last message goes out, so a client (or a test) that has its whole response
// finds the request's counters released. The release used to follow the send, and a fast
// client could read the counters first.
func TestRequestReleasedBeforeItsLastAnswer(t *testing.T) {
	for _, c := range []struct {
		name string
		resp envoy.Response
	}{
		{"last body chunk", envoy.Response{Status: 200, Chunks: [][]byte{[]byte("a"), []byte("b")}}},
		{"headers only", envoy.Response{Status: 204}},
		{"trailers", envoy.Response{Status: 200, Chunks: [][]byte{[]byte("a")}, Trailers: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			lc := &slowDone{}
			cl := serve(t, NewServer(twoPods(), firstWith(lc, nil), Options{}))
			s, _, err := cl.Route(testCtx(t), envoy.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(chatBody)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Respond(c.resp); err != nil {
				t.Fatal(err)
			}
			if !lc.released.Load() {
				t.Fatal("the client had its whole response before the request was released")
			}
			_ = s.CloseSend()
		})
	}
}
