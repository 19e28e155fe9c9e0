package serving

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/tandem-epp/tandem/conformance/envoy"
	"github.com/tandem-epp/tandem/internal/pool"
)

// One connection holds at most MaxStreamsPerConnection open ext_proc streams: a third stream
// on a connection holding two waits (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; Envoy opens
// another connection instead), while another connection's stream is served at once.
func TestStreamsPerConnectionAreCapped(t *testing.T) {
	store := pool.NewStore()
	store.Publish(pool.Info{}, onePod(), true)
	opened := make(openedObserver, 8)
	s, _, _ := start(t, Config{MaxStreamsPerConnection: 2}, store, opened)
	ctx := testCtx(t)
	c1, err := envoy.Dial(s.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	for range 2 {
		if _, err := c1.Open(ctx); err != nil {
			t.Fatal(err)
		}
		<-opened // the silent stream reached the server
	}
	// The third stream on the same connection is not opened while the two are: it waits for
	// the peer's stream quota until its context ends.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if st, err := c1.Open(short); err == nil {
		if err := st.SendRequestHeaders(envoy.Headers(":method", "GET", ":path", "/"), true, nil); err == nil {
			if _, err := st.Recv(); err == nil {
				t.Fatal("a third stream was served on a connection capped at 2")
			}
		}
	}
	select {
	case <-opened:
		t.Fatal("the server opened a third stream on a connection capped at 2")
	default:
	}
	c2, err := envoy.Dial(s.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, r, err := c2.Route(ctx, envoy.Request{Method: "GET", Path: "/", NoBody: true}); err != nil || r.Destination == "" {
		t.Fatalf("another connection's request: %v %+v", err, r)
	}
}

// A connection with no stream for MaxConnectionIdle is closed by the server (the client sees
// it leave READY and reconnects on its next request).
func TestIdleConnectionIsClosed(t *testing.T) {
	store := pool.NewStore()
	store.Publish(pool.Info{}, onePod(), true)
	s, _, _ := start(t, Config{MaxConnectionIdle: 200 * time.Millisecond}, store)
	ctx := testCtx(t)
	c, err := envoy.Dial(s.ExtProcAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rctx, cancel := context.WithCancel(ctx)
	if _, r, err := c.Route(rctx, envoy.Request{Method: "GET", Path: "/", NoBody: true}); err != nil || r.Destination == "" {
		t.Fatalf("route: %v %+v", err, r)
	}
	cancel() // the request's stream ends: the connection has no stream left
	conn := c.Conn()
	for st := conn.GetState(); st == connectivity.Ready; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatal("the idle connection was not closed within 20 s")
		}
	}
}

func TestConnectionDefaults(t *testing.T) {
	var c Config
	c.connectionDefaults()
	if c.MaxStreamsPerConnection != 1024 || c.KeepaliveMinTime != 10*time.Second || c.KeepaliveTime != time.Minute ||
		c.KeepaliveTimeout != 20*time.Second || c.MaxConnectionIdle != 5*time.Minute {
		t.Errorf("defaults %+v", c)
	}
}
