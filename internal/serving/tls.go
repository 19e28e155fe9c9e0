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

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
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

// certReloader serves the key pair in a directory and reloads it when the directory
// changes (a Secret volume swaps its ..data symlink; cert-manager rewrites files). A pair
// that fails to load keeps the previous one in service.
type certReloader struct {
	dir string
	log logr.Logger
	cur atomic.Pointer[tls.Certificate]
	// reloaded receives (without blocking) after each successful reload; tests wait on it.
	reloaded chan struct{}
}

func newCertReloader(dir string, log logr.Logger) (*certReloader, error) {
	r := &certReloader{dir: dir, log: log, reloaded: make(chan struct{}, 1)}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *certReloader) load() error {
	crt, key := filepath.Join(r.dir, CertFile), filepath.Join(r.dir, KeyFile)
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		return fmt.Errorf("loading the TLS pair %s and %s (set --cert-path to a directory holding both, PEM-encoded and matching): %w", crt, key, err)
	}
	r.cur.Store(&pair)
	return nil
}

func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// watch reloads the pair on every change in the directory until ctx ends.
func (r *certReloader) watch(ctx context.Context, w *fsnotify.Watcher) {
	defer func() { _ = w.Close() }()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Op == fsnotify.Chmod {
				continue
			}
			if err := r.load(); err != nil {
				// Often transient: the certificate is written before its key.
				r.log.Info("TLS pair not reloaded; keeping the previous one", "event", ev.String(), "error", err.Error())
				continue
			}
			r.log.Info("TLS pair reloaded", "dir", r.dir)
			select {
			case r.reloaded <- struct{}{}:
			default:
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			r.log.Error(err, "watching the TLS directory", "dir", r.dir)
		}
	}
}

// startWatch begins watching the directory. The watch is set up before returning so no
// change after it is missed.
func (r *certReloader) startWatch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s for TLS changes: %w", r.dir, err)
	}
	if err := w.Add(r.dir); err != nil {
		_ = w.Close()
		return fmt.Errorf("watching %s for TLS changes: %w", r.dir, err)
	}
	// A change between the first load and the watch would otherwise be missed.
	if err := r.load(); err != nil {
		r.log.Info("TLS pair not reloaded; keeping the previous one", "error", err.Error())
	}
	go r.watch(ctx, w)
	return nil
}
