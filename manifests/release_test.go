package manifests_test

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestReleaseArtifacts runs `make release`'s script for one platform and checks what a user
// downloads: the checksums hold, the archive's binaries run and say the release's version, the
// image tarball is tagged with the release's image, and the chart package and the rendered
// chart name that image.
func TestReleaseArtifacts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release; skipped with -short")
	}
	const version, repo = "v0.0.0-release-test", "registry.example/team/tandem-epp"
	dist := t.TempDir()
	cmd := exec.Command("hack/release.sh")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "VERSION="+version, "PLATFORMS=linux/amd64", "DIST="+dist, "IMAGE_REPO="+repo)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/release.sh: %v\n%s", err, out)
	}

	// SHA256SUMS covers every artifact, and each sum holds.
	sums, err := os.Open(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer sums.Close()
	summed := map[string]bool{}
	sc := bufio.NewScanner(sums)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		data, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != sum {
			t.Errorf("%s: checksum does not hold", name)
		}
		summed[name] = true
	}
	entries, err := os.ReadDir(dist)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		if e.Name() != "SHA256SUMS" && !summed[e.Name()] {
			t.Errorf("%s has no checksum", e.Name())
		}
	}
	sort.Strings(names)
	want := []string{"SHA256SUMS", "tandem-0.0.0-release-test.tgz", "tandem-epp-image_" + version + "_amd64.tar",
		"tandem-" + version + ".yaml", "tandem_" + version + "_linux_amd64.tar.gz"}
	sort.Strings(want)
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("artifacts %v, want %v", names, want)
	}

	// The binaries archive: epp, gateway, sim and the licence; each binary states the version.
	bins := t.TempDir()
	files := untarGz(t, filepath.Join(dist, "tandem_"+version+"_linux_amd64.tar.gz"), bins)
	dir := "tandem_" + version + "_linux_amd64/"
	for _, f := range []string{"epp", "gateway", "sim", "LICENSE"} {
		if !files[dir+f] {
			t.Errorf("the archive lacks %s (has %v)", dir+f, files)
		}
	}
	for _, b := range []string{"epp", "gateway", "sim"} {
		out, err := exec.Command(filepath.Join(bins, dir, b), "--version").Output()
		if err != nil || !strings.HasPrefix(string(out), b+" "+version+" ") {
			t.Errorf("%s --version: %q, %v; want it to name %s", b, out, err, version)
		}
	}

	// The image tarball names the release's image.
	img, err := os.Open(filepath.Join(dist, "tandem-epp-image_"+version+"_amd64.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	var manifest []struct{ RepoTags []string }
	tr := tar.NewReader(img)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "manifest.json" {
			if err := json.NewDecoder(tr).Decode(&manifest); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(manifest) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != repo+":"+version {
		t.Errorf("image tarball manifest %+v, want the tag %s:%s", manifest, repo, version)
	}

	// The chart package carries the version and the image; the rendered chart uses it.
	chart := untarGz(t, filepath.Join(dist, "tandem-0.0.0-release-test.tgz"), t.TempDir())
	if !chart["tandem/Chart.yaml"] || !chart["tandem/values.schema.json"] {
		t.Errorf("chart package files %v", chart)
	}
	rendered, err := os.ReadFile(filepath.Join(dist, "tandem-"+version+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rendered), "image: "+repo+":"+version+"\n") {
		t.Errorf("the rendered chart does not run %s:%s", repo, version)
	}
}

// untarGz extracts a .tar.gz into dir and returns the names of its regular files.
func untarGz(t *testing.T, path, dir string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		names[h.Name] = true
		out := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		w, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode)&0o755|0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(w, tr); err != nil { //nolint:gosec // a test's own archive
			t.Fatal(err)
		}
		w.Close()
	}
}
