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
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
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

// certReloader serves the key pair in a directory through controller-runtime's certwatcher: it
// watches both files (a Secret volume swaps its ..data symlink; cert-manager rewrites files),
// re-reads them every certPollInterval, and keeps the previous pair in service when the files
// do not hold a valid matching pair (often transient: the certificate is written before its key).
type certReloader struct {
	dir     string
	log     logr.Logger
	watcher *certwatcher.CertWatcher
	// reloaded receives (without blocking) after each change of the served pair; tests wait on it.
	reloaded chan struct{}
}

func newCertReloader(dir string, log logr.Logger) (*certReloader, error) {
	crt, key := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	w, err := certwatcher.New(crt, key)
	if err != nil {
		return nil, fmt.Errorf("loading the TLS pair %s and %s (set --cert-path to a directory holding both, PEM-encoded and matching): %w", crt, key, err)
	}
	r := &certReloader{dir: dir, log: log, watcher: w.WithWatchInterval(certPollInterval), reloaded: make(chan struct{}, 1)}
	// RegisterCallback calls back at once with the pair just loaded; only later calls are reloads.
	var registered atomic.Bool
	w.RegisterCallback(func(tls.Certificate) {
		if !registered.Load() {
			return
		}
		r.log.Info("TLS pair reloaded", "dir", r.dir)
		select {
		case r.reloaded <- struct{}{}:
		default:
		}
	})
	registered.Store(true)
	return r, nil
}

func (r *certReloader) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.watcher.GetCertificate(hello)
}

// start watches and polls the pair until ctx ends, in the background. A change made before
// the watches are set is picked up by the next poll.
func (r *certReloader) start(ctx context.Context) {
	go func() {
		if err := r.watcher.Start(ctx); err != nil && ctx.Err() == nil {
			r.log.Error(err, "watching the TLS pair; it will not be reloaded", "dir", r.dir)
		}
	}()
}
