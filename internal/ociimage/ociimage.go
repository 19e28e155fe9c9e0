// Package ociimage assembles Tandem's EPP container image without a container engine (`make
// image`): the static cmd/epp binary on an empty base, with the CA roots a scratch image lacks
// and the nonroot user the Dockerfile's distroless base runs as, written as an image tarball that
// `docker load`, `podman load`, `kind load image-archive` and `crane push` take. The layers and
// tarball come from go-containerregistry. It must not build Go code or talk to a registry.
package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// What the image holds, and how it runs: the same user, entrypoint and ports as the Dockerfile.
const (
	BinaryPath = "/epp"
	CAPath     = "/etc/ssl/certs/ca-certificates.crt" // where Go on Linux looks for system roots
	User       = "65532:65532"                        // distroless's nonroot; the manifests' runAsUser
)

// Ports the EPP listens on: ext_proc, gRPC health, metrics.
var Ports = []string{"9002/tcp", "9003/tcp", "9090/tcp"}

// Options describe one image.
type Options struct {
	Binary      string // path of a static linux cmd/epp binary
	Arch        string // GOARCH the binary was built for
	Version     string // for the org.opencontainers.image.version label
	Commit      string // for the org.opencontainers.image.revision label
	Conformance bool   // entrypoint adds --conformance (the Dockerfile's conformance target); never for production
}

// Build assembles the image.
func Build(o Options) (v1.Image, error) {
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("image: the EPP binary: %w", err)
	}
	files, err := rootFS(bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(files)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", o.Arch
	cf.Config.Entrypoint = []string{BinaryPath}
	if o.Conformance {
		cf.Config.Entrypoint = append(cf.Config.Entrypoint, "--conformance")
	}
	cf.Config.User = User
	cf.Config.ExposedPorts = map[string]struct{}{}
	for _, p := range Ports {
		cf.Config.ExposedPorts[p] = struct{}{}
	}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "tandem-epp",
		"org.opencontainers.image.source":   "https://github.com/tandem-epp/tandem",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.revision": o.Commit,
	}
	return mutate.ConfigFile(img, cf)
}

// Write builds the image and writes it as a tarball tagged ref.
func Write(path, ref string, o Options) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w (want registry/repository:tag)", ref, err)
	}
	img, err := Build(o)
	if err != nil {
		return err
	}
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// rootFS is the image's only layer: the binary, the CA roots, and passwd/group naming the user.
func rootFS(bin []byte) ([]byte, error) {
	var roots bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue // a PEM bundle cannot carry a distrust-after constraint; leave such roots out
		}
		if err := pem.Encode(&roots, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0) // reproducible: the same binary gives the same layer digest
	for _, d := range []string{"etc/", "etc/ssl/", "etc/ssl/certs/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{
		{BinaryPath[1:], 0o755, bin},
		{CAPath[1:], 0o644, roots.Bytes()},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n")},
	} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
