// Command image is `make image`: it builds cmd/epp statically for linux and writes the EPP's
// container image as a tarball (internal/ociimage), with no container engine. It only builds
// the binary and calls internal/ociimage; the image's content is decided there.
//
//	go run ./hack/image -image ghcr.io/tandem-epp/tandem-epp:v0.1.0 -out bin/tandem-epp-image.tar [-arch arm64] [-ldflags …]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"

	"github.com/tandem-epp/tandem/internal/ociimage"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	ref := fs.String("image", "ghcr.io/tandem-epp/tandem-epp:dev", "name and tag of the image")
	out := fs.String("out", "bin/tandem-epp-image.tar", "tarball to write")
	arch := fs.String("arch", runtime.GOARCH, "GOARCH of the image (amd64, arm64, …)")
	ldflags := fs.String("ldflags", "-s -w", "-ldflags of the go build (the Makefile adds the version stamp)")
	conformance := fs.Bool("conformance", false, "entrypoint adds --conformance, like the Dockerfile's conformance target (never for production)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	tmp, err := os.MkdirTemp("", "tandem-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "epp")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", *ldflags, "-o", bin, "./cmd/epp")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+*arch)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "building cmd/epp for linux/%s …\n", *arch)
	if err := build.Run(); err != nil {
		return fmt.Errorf("%s: %w", build, err)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	o := ociimage.Options{Binary: bin, Arch: *arch, Conformance: *conformance,
		Version: stamp(*ldflags, "version"), Commit: stamp(*ldflags, "commit")}
	if err := ociimage.Write(*out, *ref, o); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%s, linux/%s); load it with docker load -i, kind load image-archive, or push it with crane push\n", *out, *ref, *arch)
	return nil
}

// stamp reads the value -X gives internal/version's variable name out of ldflags.
func stamp(ldflags, name string) string {
	m := regexp.MustCompile(`internal/version\.` + name + `=(\S+)`).FindStringSubmatch(ldflags)
	if m == nil {
		return ""
	}
	return m[1]
}
