package serving

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/tandem-epp/tandem/internal/filewatch"
)

// Names of the key pair in a --cert-path directory (a kubernetes.io/tls Secret's keys).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// selfSignedValidity is long because gateways talk to the EPP without verifying its
// certificate; a restart makes a new one anyway.
const selfSignedValidity = 10 * 365 * 24 * time.Hour

// SelfSignedCertificate makes an ECDSA P-256 certificate for the ext_proc server.
func SelfSignedCertificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating the TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating the certificate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"Tandem"}, CommonName: "tandem-epp"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(selfSignedValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signing the certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// certPollInterval is how often the --cert-path pair is re-read even without a file event, as
// a safety net for missed notifications.
const certPollInterval = 10 * time.Second

// certReloader serves the key pair in a directory: it watches both files (a Secret volume
// swaps its ..data symlink; cert-manager rewrites files), re-reads them every
// certPollInterval, and keeps the previous pair in service when the files do not hold a valid
// matching pair (often transient: the certificate is written before its key).
type certReloader struct {
	dir      string
	crt, key string
	log      logr.Logger
	current  atomic.Pointer[tls.Certificate]
	mu       sync.Mutex // serialises reloads from the two watches
	lastErr  string     // the last failed load's error, logged once (guarded by mu)
	// reloaded receives (without blocking) after each change of the served pair; tests wait on it.
	reloaded chan struct{}
}

func newCertReloader(dir string, log logr.Logger) (*certReloader, error) {
	r := &certReloader{dir: dir, crt: filepath.Join(dir, CertFile), key: filepath.Join(dir, KeyFile), log: log,
		reloaded: make(chan struct{}, 1)}
	pair, err := tls.LoadX509KeyPair(r.crt, r.key)
	if err != nil {
		return nil, fmt.Errorf("loading the TLS pair %s and %s (set --cert-path to a directory holding both, PEM-encoded and matching): %w", r.crt, r.key, err)
	}
	r.current.Store(&pair)
	return r, nil
}

func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.current.Load(), nil
}

// reload serves the pair on disk if it is valid and differs from the one in service.
func (r *certReloader) reload() {
	r.mu.Lock()
	defer r.mu.Unlock()
	pair, err := tls.LoadX509KeyPair(r.crt, r.key)
	if err != nil {
		// Often mid-rotation (the certificate written before its key): the last good pair
		// stays, and the next change of either file retries. Said once per distinct error.
		if msg := err.Error(); msg != r.lastErr {
			r.lastErr = msg
			r.log.Info("WARNING: the TLS pair on disk does not load; the last good pair stays in service", "dir", r.dir, "error", msg)
		}
		return
	}
	r.lastErr = ""
	if cur := r.current.Load(); cur != nil && len(cur.Certificate) > 0 && len(pair.Certificate) > 0 &&
		string(cur.Certificate[0]) == string(pair.Certificate[0]) {
		return
	}
	r.current.Store(&pair)
	r.log.Info("TLS pair reloaded", "dir", r.dir)
	select {
	case r.reloaded <- struct{}{}:
	default:
	}
}

// start watches and polls both files until ctx ends, in the background. A change made before
// the watches are set is picked up by the next poll.
func (r *certReloader) start(ctx context.Context) {
	for _, path := range []string{r.crt, r.key} {
		go filewatch.Watch(ctx, path, nil, filewatch.Options{Poll: certPollInterval,
			NotifyFailed: func(err error) {
				r.log.Info("watching the TLS pair for changes failed; polling every "+certPollInterval.String(), "error", err.Error())
			}},
			func([]byte) { r.reload() },
			func(err error) {
				r.log.Info("reading the TLS pair; the last good pair stays in service", "error", err.Error())
			})
	}
}
