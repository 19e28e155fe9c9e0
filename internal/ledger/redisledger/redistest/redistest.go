// Package redistest starts real redis-server processes on 127.0.0.1 for tests: a free port,
// a temporary directory, no persistence, killed at cleanup. It must not be imported by
// production code.
package redistest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options configure a test server.
type Options struct {
	Password string // requirepass
	// TLS serves TLS only, with a self-signed certificate for 127.0.0.1 made at start.
	TLS bool
}

// Server is one redis-server process; Kill and Start stop and restart it on the same port.
type Server struct {
	t    *testing.T
	o    Options
	bin  string
	dir  string
	Port int
	cmd  *exec.Cmd
	done chan struct{}
}

// Binary returns $TANDEM_REDIS_SERVER or redis-server from PATH, failing the test with how
// to get one when there is none (hack/ensure-redis.sh installs Debian's package).
func Binary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("TANDEM_REDIS_SERVER"); b != "" {
		return b
	}
	b, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found: run hack/ensure-redis.sh (installs Debian's redis-server) or set TANDEM_REDIS_SERVER")
	}
	return b
}

// Start runs redis-server on a free 127.0.0.1 port and waits until it accepts connections.
func Start(t *testing.T) *Server { t.Helper(); return StartWith(t, Options{}) }

// StartWith is Start with a password or TLS.
func StartWith(t *testing.T, o Options) *Server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &Server{t: t, o: o, bin: Binary(t), dir: t.TempDir(), Port: port}
	if o.TLS {
		writeCert(t, s.dir)
	}
	s.Start()
	t.Cleanup(s.Kill)
	return s
}

// Addr is "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// Start (re)starts the server on its port; it holds no data from a previous run.
func (s *Server) Start() {
	s.t.Helper()
	args := []string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", s.dir, "--daemonize", "no", "--protected-mode", "yes"}
	if s.o.Password != "" {
		args = append(args, "--requirepass", s.o.Password)
	}
	if s.o.TLS {
		crt, key := filepath.Join(s.dir, "tls.crt"), filepath.Join(s.dir, "tls.key")
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(s.Port), "--tls-cert-file", crt,
			"--tls-key-file", key, "--tls-ca-cert-file", crt, "--tls-auth-clients", "no")
	}
	cmd := exec.Command(s.bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	ready := make(chan error, 1)
	var logMu sync.Mutex
	var log strings.Builder
	logged := func() string { logMu.Lock(); defer logMu.Unlock(); return log.String() }
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			if !signalled {
				logMu.Lock()
				log.WriteString(sc.Text() + "\n")
				logMu.Unlock()
			}
			if !signalled && strings.Contains(sc.Text(), "Ready to accept connections") {
				signalled = true
				ready <- nil
			}
		}
		if !signalled {
			ready <- fmt.Errorf("redis-server exited before accepting connections")
		}
	}()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case err := <-ready:
		if err != nil {
			<-done
			s.t.Fatalf("%v:\n%s", err, logged())
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		s.t.Fatalf("redis-server not ready after 10 s:\n%s", logged())
	}
	s.cmd, s.done = cmd, done
}

// Kill stops the server (SIGKILL: an outage, not a shutdown) and waits for it to exit.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// writeCert writes a self-signed certificate for 127.0.0.1 (tls.crt, tls.key) into dir.
func writeCert(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
}
