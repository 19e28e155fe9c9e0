package handoff

import (
	"errors"

	"github.com/tandem-epp/tandem/internal/apierror"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/tandem-epp/tandem/internal/pool"
)

// endpoint builds a pool endpoint at ip:port with the given engine and extra labels.
func endpoint(name, ip string, port int, engine string, labels, annotations map[string]string) *pool.Endpoint {
	l := map[string]string{pool.LabelEngine: engine}
	for k, v := range labels {
		l[k] = v
	}
	return pool.NewEndpoint("ns", name, ip, int32(port), 0, l, annotations)
}

// serverEndpoint is an endpoint for a real test server on 127.0.0.1.
func serverEndpoint(t *testing.T, srv *httptest.Server, name, engine string, labels, annotations map[string]string) *pool.Endpoint {
	t.Helper()
	host, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return endpoint(name, host, p, engine, labels, annotations)
}

func asAPIError(t *testing.T, err error) *apierror.Error {
	t.Helper()
	var ae *apierror.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T) is not an *apierror.Error", err, err)
	}
	return ae
}

// serverInfoServer answers GET /server_info with body.
func serverInfoServer(t *testing.T, body string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/server_info" || r.Method != http.MethodGet {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv
}
