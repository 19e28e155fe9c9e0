package launch

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-epp/tandem/traces"
)

func TestParseRejects(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(bin, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--handoff", "both"}, `--handoff "both": want auto, sidecar or epp`},
		{[]string{"--conv", "-1"}, "--conv=-1: must be 0 or more"},
		{[]string{"--conv", "0", "--code", "0", "--mooncake", "0"}, "the workload is empty"},
		{[]string{"--window", "0s"}, "--window=0s: must be positive"},
		{[]string{"--time-scale", "0"}, "--time-scale=0: want a factor in (0, 10]"},
		{[]string{"--listen", "8080"}, `--listen "8080": want host:port`},
		{[]string{"--epp-binary", bin}, "not an executable file"},
		{[]string{"--epp-binary", filepath.Join(t.TempDir(), "nope")}, "--epp-binary: stat"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"--broken-decode", "prefill-a"}, `--broken-decode "prefill-a": want one of the demo's decode pods (decode-a, decode-b) or none`},
		{[]string{"--break-at", "1"}, "--break-at=1: want a fraction of --window in [0, 1)"},
	}
	for _, c := range cases {
		_, err := Parse(c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want it to contain %q", c.args, err, c.want)
		}
	}
}

// TestHandoffReachesTandem: every hand-off --handoff accepts is passed to Tandem as
// TANDEM_PD_HANDOFF; empty passes nothing, so Tandem's own default (auto) applies.
func TestHandoffReachesTandem(t *testing.T) {
	for _, h := range []string{"", "auto", "sidecar", "epp"} {
		f, err := Parse([]string{"--handoff=" + h}, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("--handoff=%q: %v", h, err)
		}
		got, ok := f.EPPEnv()["TANDEM_PD_HANDOFF"]
		if want := h != ""; ok != want || got != h {
			t.Errorf("--handoff=%q: TANDEM_PD_HANDOFF = %q (set %v), want %q (set %v)", h, got, ok, h, want)
		}
	}
}

// TestBrokenDecodeFlag: by default the second roleset's decode pod breaks a third of the way
// through the replay; none (or empty) keeps every pod healthy.
func TestBrokenDecodeFlag(t *testing.T) {
	f, err := Parse(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if f.BrokenDecode != "decode-b" || f.BreakAt != 0.33 {
		t.Errorf("defaults: --broken-decode %q --break-at %g, want decode-b 0.33", f.BrokenDecode, f.BreakAt)
	}
	for _, v := range []string{"none", ""} {
		f, err := Parse([]string{"--broken-decode=" + v}, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("--broken-decode=%q: %v", v, err)
		}
		if f.BrokenDecode != "" {
			t.Errorf("--broken-decode=%q: broken pod %q, want none", v, f.BrokenDecode)
		}
	}
}

// TestDefaultWorkloadFromTheRepository: the default flags replay the documented slice of the
// traces shipped in traces/, with no directory beside the clone.
func TestDefaultWorkloadFromTheRepository(t *testing.T) {
	f, err := Parse(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := f.Workload()
	if err != nil {
		t.Fatal(err)
	}
	bySource := map[string]int{}
	for _, r := range reqs {
		bySource[r.Source]++
	}
	if len(reqs) != 260 || bySource["azure-llm-2023-conv"] != 160 || bySource["azure-llm-2023-code"] != 60 || bySource["mooncake-synthetic"] != 40 {
		t.Errorf("default workload: %d requests %v, want 160 conv + 60 code + 40 mooncake", len(reqs), bySource)
	}
}

// TestMainChecksInputsBeforeBuilding: a wrong --data fails at once, naming the missing file,
// with no build started (it returns in well under a build's time, and prints no build line).
func TestMainChecksInputsBeforeBuilding(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, traces.AzureConv), []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	start := time.Now()
	code := Main([]string{"--data", dir}, &out, &errOut)
	if code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	msg := errOut.String()
	if !strings.Contains(msg, filepath.Join(dir, traces.AzureCode)) || !strings.Contains(msg, "--data") || strings.Contains(msg, "Preparing the build") {
		t.Errorf("stderr = %q, want the missing %s named with --data, and no build", msg, traces.AzureCode)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to reject --data", d)
	}
	// A bad trace file (not only a missing one) is caught before the build too.
	if err := os.WriteFile(filepath.Join(dir, traces.AzureCode), []byte("nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, traces.Mooncake), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if code := Main([]string{"--data", dir}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "want TIMESTAMP,ContextTokens,GeneratedTokens") {
		t.Errorf("bad trace: exit %d, stderr %q", code, errOut.String())
	}
}

// TestBuildShowsProgress builds a small real package with a cold build cache, so that packages
// are compiled, and checks the progress lines and the binary.
func TestBuildShowsProgress(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build; skipped with -short")
	}
	root, err := FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOCACHE", t.TempDir())
	out := t.TempDir()
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err = Build(ctx, BuildOptions{Root: root, OutDir: out, Packages: []string{"./internal/version/testdata/probe"}, What: "the probe",
		LDFlags: "-X github.com/tandem-epp/tandem/internal/version.version=v0.0.0-launch-test", Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	p := progress.String()
	if !strings.Contains(p, "Preparing the build of the probe") || !strings.Contains(p, "Built the probe (") || !strings.Contains(p, " packages compiled") {
		t.Errorf("progress output lacks the phases:\n%s", p)
	}
	got, err := exec.Command(filepath.Join(out, "probe")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), "probe v0.0.0-launch-test ") {
		t.Errorf("built probe prints %q; the -ldflags stamp did not reach it", got)
	}
	// A failing build reports go's own error lines.
	err = Build(ctx, BuildOptions{Root: root, OutDir: out, Packages: []string{"./no/such/package"}, What: "nothing", Progress: &bytes.Buffer{}})
	if err == nil || !strings.Contains(err.Error(), "no/such/package") {
		t.Errorf("building a missing package: err = %v", err)
	}
}

// TestLauncherStaysLight: cmd/demo must compile in seconds on a fresh machine, so it may import
// the standard library and these packages only (no gRPC, no Kubernetes, no simulator).
func TestLauncherStaysLight(t *testing.T) {
	root, err := FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./cmd/demo")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"github.com/tandem-epp/tandem/cmd/demo": true, "github.com/tandem-epp/tandem/internal/demo/launch": true,
		"github.com/tandem-epp/tandem/internal/demo/workload": true, "github.com/tandem-epp/tandem/traces": true,
		"github.com/tandem-epp/tandem/internal/version": true,
	}
	for _, p := range strings.Fields(string(out)) {
		if !allowed[p] {
			t.Errorf("cmd/demo depends on %s; keep it out of the launcher (it belongs in the runner)", p)
		}
	}
}
