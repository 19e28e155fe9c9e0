package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/internal/gateway"
	"github.com/tandem-epp/tandem/internal/sim"
)

// A real nginx (Debian's, with the njs module; hack/ensure-nginx.sh installs both) configured the
// way NGINX Gateway Fabric v2.6 configures an InferencePool route: a js_content handler asks the
// endpoint-picker shim for the destination, stores it in a js_var, and redirects to an internal
// location whose proxy_pass takes that variable as the upstream; an empty pick falls back, via a
// map, to an upstream of all the pool's pods. The njs module below is written for this test from
// that behaviour. The shim is internal/gateway's, on a loopback listener.

// nginxPickJS is the njs handler: ask the shim, keep a 200's destination, always redirect.
const nginxPickJS = `
async function pick(r) {
	const headers = {};
	for (const name in r.headersIn) {
		headers[name] = r.headersIn[name];
	}
	headers['X-EPP-Host'] = r.variables.epp_host;
	headers['X-EPP-Port'] = r.variables.epp_port;
	// The pick stays empty (nginx then uses the pool's upstream) unless the shim names one. (NGF
	// also logs the shim's error body; reading the body of a non-200 reply crashes Debian's njs
	// 0.7.9, so this handler logs the status only.)
	let chosen = '';
	try {
		const answer = await ngx.fetch(r.variables.shim_url, {method: r.method, headers: headers, body: r.requestText});
		const named = answer.headers.get('X-Gateway-Destination-Endpoint');
		if (answer.status === 200 && named) {
			chosen = named;
		} else {
			r.error('endpoint picker gave no endpoint: status ' + answer.status);
		}
	} catch (e) {
		r.error('endpoint picker call failed: ' + e);
	}
	r.variables.picked = chosen;
	const query = r.variables.args ? '?' + r.variables.args : '';
	r.internalRedirect('/_to_pool' + query);
}
export default {pick};
`

// nginxConf renders the configuration: listen on port, ask the shim at shimURL about the EPP at
// eppHost:eppPort, fall back to the pool's pods, strip the overlay's headers before the upstream.
func nginxConf(dir string, port int, shimURL, eppHost, eppPort string, pool []string) string {
	var servers, strip strings.Builder
	for _, p := range pool {
		fmt.Fprintf(&servers, "\t\tserver %s;\n", p)
	}
	for _, h := range ngfStripped {
		fmt.Fprintf(&strip, "\t\t\tproxy_set_header %s \"\";\n", h)
	}
	return fmt.Sprintf(`load_module /usr/lib/nginx/modules/ngx_http_js_module.so;
daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events {}
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	js_import picker from %[1]s/pick.js;
	js_var $picked;
	upstream pool {
		random;
%[2]s	}
	map $picked $target {
		"" pool;
		default $picked;
	}
	server {
		listen 127.0.0.1:%[3]d;
		client_body_buffer_size 4m;
		client_max_body_size 4m;
		location / {
			set $shim_url %[4]s;
			set $epp_host %[5]s;
			set $epp_port %[6]s;
			js_content picker.pick;
		}
		location /_to_pool {
			internal;
			proxy_http_version 1.1;
%[7]s			proxy_pass http://$target$request_uri;
		}
	}
}
`, dir, servers.String(), port, shimURL, eppHost, eppPort, strip.String())
}

// recordingShim is the shim, remembering the destination it answered for each request.
type recordingShim struct {
	gateway.Shim
	mu    sync.Mutex
	picks []string
}

func (s *recordingShim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.Shim.ServeHTTP(w, r) // the header map keeps what the shim set
	s.mu.Lock()
	s.picks = append(s.picks, w.Header().Get("X-Gateway-Destination-Endpoint"))
	s.mu.Unlock()
}

func (s *recordingShim) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.picks) == 0 {
		return ""
	}
	return s.picks[len(s.picks)-1]
}

// startRealNGINX runs nginx for the test's life in front of the shim and the EPP at eppAddr.
func startRealNGINX(t *testing.T, eppAddr string, pods map[string]*pod) (url string, shim *recordingShim, errorLog string) {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin = "/usr/sbin/nginx"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("nginx is not installed: run hack/ensure-nginx.sh (hack/test.sh does): %v", err)
	}
	if _, err := os.Stat("/usr/lib/nginx/modules/ngx_http_js_module.so"); err != nil {
		t.Fatalf("nginx's njs module is not installed: run hack/ensure-nginx.sh: %v", err)
	}
	shim = &recordingShim{}
	shimLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	shimSrv := &http.Server{Handler: shim, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = shimSrv.Serve(shimLn) }()
	t.Cleanup(func() { _ = shimSrv.Close() })

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pick.js"), []byte(nginxPickJS), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var pool []string
	for _, p := range pods {
		pool = append(pool, p.HostPort())
	}
	host, eppPort, _ := net.SplitHostPort(eppAddr)
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConf(dir, port, "http://"+shimLn.Addr().String(), host, eppPort, pool)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"))
	out, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting nginx: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		out.Close()
	})
	url = fmt.Sprintf("http://127.0.0.1:%d", port)
	eventually(t, "nginx to listen", func() (bool, string) {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err != nil {
			b, _ := os.ReadFile(filepath.Join(dir, "stderr.log"))
			e, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			return false, fmt.Sprintf("%v; stderr %s; error.log %s", err, b, e)
		}
		c.Close()
		return true, ""
	})
	return url, shim, filepath.Join(dir, "error.log")
}

// TestRealNGINXInFrontOfTandem: real nginx and njs, configured as NGINX Gateway Fabric does,
// on a pool of three pods. Every request, streamed or not, reaches the pod Tandem picked; with
// the fallback list forced on (how Tandem answered before issue 13) nginx fails every request
// with "invalid port in upstream"; an error from Tandem makes nginx pick a pool pod itself.
func TestRealNGINXInFrontOfTandem(t *testing.T) {
	lr := `{"profiles":{"default":{"routingStrategy":"least-request"}}}`
	specs := []podSpec{{name: "std-0", role: sim.RoleStandard, config: lr},
		{name: "std-1", role: sim.RoleStandard, config: lr}, {name: "std-2", role: sim.RoleStandard, config: lr}}
	for _, tc := range []struct {
		name      string
		args      []string
		wantOK    bool
		wantInLog string
	}{
		{"defaults", nil, true, ""},
		{"fallback list forced on", []string{"--destination-fallbacks=on"}, false, "invalid port in upstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &stack{t: t, pods: startPods(t, specs...), poolFile: filepath.Join(t.TempDir(), "endpoints.yaml")}
			var all []*pod
			for _, sp := range specs {
				all = append(all, s.pods[sp.name])
			}
			writePoolFile(t, s.poolFile, all...)
			s.tandem = startTandem(t, append([]string{"--endpoints-file=" + s.poolFile}, tc.args...), defaultEnv(nil), nil)
			url, shim, errLog := startRealNGINX(t, s.tandem.ExtProcAddr(), s.pods)
			c := newClient()
			ctx := testCtx(t, 60*time.Second)
			per := map[string]int{}
			for i := 0; i < 6; i++ {
				stream := i%2 == 0
				m := s.marker("nginx")
				r := post(ctx, c, url, "/v1/chat/completions", chatBody(prompt(m, 64), 4, stream), nil)
				if !tc.wantOK {
					if r.status != http.StatusInternalServerError {
						t.Fatalf("want nginx's 500 for a destination list, got %v", r)
					}
					continue
				}
				if err := okCompletion(r, stream); err != nil {
					t.Fatal(err)
				}
				p := s.pods[r.pod]
				if p == nil || p.HostPort() != shim.last() {
					t.Fatalf("served by %q, but Tandem picked %q", r.pod, shim.last())
				}
				per[r.pod]++
			}
			if tc.wantOK && (per["std-0"] != 2 || per["std-1"] != 2 || per["std-2"] != 2) {
				t.Errorf("requests per pod %v, want 2 each (held in-flight counts spread the picks)", per)
			}
			if tc.wantInLog != "" {
				b, _ := os.ReadFile(errLog)
				if !strings.Contains(string(b), tc.wantInLog) {
					t.Errorf("nginx's error log lacks %q:\n%s", tc.wantInLog, b)
				}
			}
			if !tc.wantOK {
				return
			}
			// Tandem's 400 (no model) never reaches the client: nginx sends the request to a pool pod.
			r := post(ctx, c, url, "/v1/chat/completions", []byte(`{"messages":[{"role":"user","content":"hi"}]}`), nil)
			b, _ := os.ReadFile(errLog)
			se, _ := os.ReadFile(filepath.Join(filepath.Dir(errLog), "stderr.log"))
			b = append(b, se...)
			if r.err != nil || r.header.Get("X-Error-Routing") != "" {
				t.Fatalf("want the engine's own answer after Tandem's 400: %v %v\nnginx error log:\n%s", r, r.header, b)
			}
			if !strings.Contains(string(b), "endpoint picker gave no endpoint: status 400") {
				t.Errorf("nginx's error log does not show the shim's 400:\n%s", b)
			}
		})
	}
}
