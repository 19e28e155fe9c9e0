package ociimage

import (
	"archive/tar"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestMakeImage runs `make image` as a user would (no container engine), reads the tarball
// back, checks the image's configuration, unpacks its filesystem and runs the EPP binary from it.
func TestMakeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/epp; skipped with -short")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	const ref = "registry.example/team/tandem-epp:v0.0.0-image-test"
	mk := exec.Command("make", "image", "IMAGE="+ref, "IMAGE_TAR="+out, "VERSION=v0.0.0-image-test", "COMMIT=c0ffee", "GOARCH="+runtime.GOARCH)
	mk.Dir = root
	if b, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mk, err, b)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("the tarball does not hold %s: %v", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/epp"}) || c.User != User || cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config: entrypoint %v user %q platform %s/%s; want [/epp], %s, linux/%s", c.Entrypoint, c.User, cf.OS, cf.Architecture, User, runtime.GOARCH)
	}
	for _, p := range Ports {
		if _, ok := c.ExposedPorts[p]; !ok {
			t.Errorf("port %s not exposed: %v", p, c.ExposedPorts)
		}
	}
	if c.Labels["org.opencontainers.image.version"] != "v0.0.0-image-test" || c.Labels["org.opencontainers.image.revision"] != "c0ffee" {
		t.Errorf("labels = %v", c.Labels)
	}

	// Unpack the filesystem and look at what the container would run.
	fsRoot := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := untar(t, rc, fsRoot)
	for _, want := range []string{"epp", "etc/ssl/certs/ca-certificates.crt", "etc/passwd", "etc/group"} {
		if !files[want] {
			t.Errorf("the image has no /%s (files: %v)", want, files)
		}
	}
	v, err := exec.Command(filepath.Join(fsRoot, "epp"), "--version").Output()
	if err != nil {
		t.Fatalf("/epp --version from the image: %v", err)
	}
	if !strings.HasPrefix(string(v), "epp v0.0.0-image-test (commit c0ffee, ") {
		t.Errorf("/epp --version = %q", v)
	}
	pemData, err := os.ReadFile(filepath.Join(fsRoot, CAPath))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for block, rest := pem.Decode(pemData); block != nil; block, rest = pem.Decode(rest) {
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Fatalf("CA bundle entry %d: %v", n, err)
		}
		n++
	}
	if n < 100 {
		t.Errorf("the CA bundle has %d roots; want the NSS set (over 100)", n)
	}
	passwd, _ := os.ReadFile(filepath.Join(fsRoot, "etc/passwd"))
	if !strings.Contains(string(passwd), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd lacks the nonroot user: %q", passwd)
	}
}

// TestBuildIsReproducible: the same binary gives the same image digest.
func TestBuildIsReproducible(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "epp")
	if err := os.WriteFile(bin, []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var digests []string
	for range 2 {
		img, err := Build(Options{Binary: bin, Arch: "arm64", Version: "v1", Commit: "c"})
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
	}
	if digests[0] != digests[1] {
		t.Errorf("digests differ: %v", digests)
	}
	if _, err := Build(Options{Binary: filepath.Join(t.TempDir(), "missing")}); err == nil || !strings.Contains(err.Error(), "the EPP binary") {
		t.Errorf("missing binary: err = %v", err)
	}
	if err := Write(filepath.Join(t.TempDir(), "x.tar"), "Not A Ref!", Options{Binary: bin}); err == nil || !strings.Contains(err.Error(), "registry/repository:tag") {
		t.Errorf("bad image name: err = %v", err)
	}
}

func untar(t *testing.T, r io.Reader, dir string) map[string]bool {
	t.Helper()
	files := map[string]bool{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
			files[strings.TrimPrefix(h.Name, "/")] = true
		}
	}
}
