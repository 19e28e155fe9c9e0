package manifests_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// There is no container engine here, so the image itself is not built; this checks the
// Dockerfile's promises and runs its build command.

// dockerBuild is the Dockerfile's build command: static, trimmed, stamped by hack/ldflags.sh.
const dockerBuild = `go build -trimpath -ldflags="-s -w $(hack/ldflags.sh)" -o /out/epp ./cmd/epp`

type dockerStage struct {
	name  string
	lines []string
}

func dockerStages(t *testing.T) []dockerStage {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	from := regexp.MustCompile(`^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?`)
	var stages []dockerStage
	for _, l := range strings.Split(string(data), "\n") {
		if m := from.FindStringSubmatch(l); m != nil {
			stages = append(stages, dockerStage{name: m[2], lines: []string{l}})
			continue
		}
		if len(stages) > 0 && !strings.HasPrefix(strings.TrimSpace(l), "#") {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, l)
		}
	}
	return stages
}

func TestDockerfile(t *testing.T) {
	stages := dockerStages(t)
	byName := map[string]dockerStage{}
	for _, s := range stages {
		byName[s.name] = s
	}
	last := stages[len(stages)-1]
	if last.name != "epp" {
		t.Errorf("the default (last) stage is %q; it must be the production image epp", last.name)
	}
	for name, entry := range map[string]string{"epp": `ENTRYPOINT ["/epp"]`, "conformance": `ENTRYPOINT ["/epp", "--conformance"]`} {
		s, ok := byName[name]
		if !ok {
			t.Errorf("no stage %q", name)
			continue
		}
		text := strings.Join(s.lines, "\n")
		for _, want := range []string{"FROM gcr.io/distroless/static-debian12:nonroot", "USER 65532:65532", entry} {
			if !strings.Contains(text, want) {
				t.Errorf("stage %s lacks %q", name, want)
			}
		}
	}
	build := strings.Join(byName["build"].lines, "\n")
	if !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, dockerBuild) {
		t.Errorf("the build stage must run CGO_ENABLED=0 %s", dockerBuild)
	}
}

// TestDockerBuildCommandMakesAStaticBinary runs the Dockerfile's build command, as its RUN line
// has it, with the VERSION and COMMIT build args set, and checks the result needs no dynamic
// loader (it runs on distroless/static or scratch) and reports the stamped version.
func TestDockerBuildCommandMakesAStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/epp; skipped with -short")
	}
	out := filepath.Join(t.TempDir(), "epp")
	var run string
	for _, l := range dockerStages(t)[0].lines {
		if strings.Contains(l, "go build") {
			run = strings.TrimSpace(l)
		}
	}
	if run != dockerBuild {
		t.Fatalf("the build stage's go build line is %q, want %q", run, dockerBuild)
	}
	cmd := exec.Command("bash", "-c", strings.Replace(run, "/out/epp", out, 1))
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "VERSION=v0.0.0-dockerfile-test", "COMMIT=0123456789abcdef")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	got, err := exec.Command(out, "--version").Output()
	if err != nil {
		t.Fatalf("epp --version: %v", err)
	}
	if !strings.HasPrefix(string(got), "epp v0.0.0-dockerfile-test (commit 0123456789abcdef, go") {
		t.Errorf("epp --version = %q, want the VERSION and COMMIT build args", got)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary asks for a dynamic loader; it will not run on distroless/static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary links %v", libs)
	}
}
