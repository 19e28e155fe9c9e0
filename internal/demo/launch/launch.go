// Package launch is the demo's command line and its first, fast half (cmd/demo): it parses the
// flags, checks every input (the traces are read and the replay built), and only then builds
// Tandem (./cmd/epp) and the demo runner (./internal/demo/runner) with a progress line, and runs
// the runner with the same flags. It imports only the standard library, the traces and the
// workload, so that `go run ./cmd/demo` compiles it in seconds on a fresh machine and a wrong
// flag or --data fails before the slow build. It must not start pods, gateways or Tandem itself.
package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tandem-epp/tandem/internal/version"
)

// Packages the launcher builds: the runner (the demo proper) and Tandem.
const (
	RunnerPackage = "./internal/demo/runner"
	EPPPackage    = "./cmd/epp"
)

// Main is cmd/demo: it returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	f, err := Parse(args, stderr)
	switch {
	case errors.Is(err, ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintln(stderr, "demo:", err)
		return 2
	}
	if f.Version {
		fmt.Fprintln(stdout, version.Line("demo"))
		return 0
	}
	reqs, err := f.Workload()
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 2
	}
	fmt.Fprintf(stderr, "Inputs checked: %d requests to replay from %s.\n", len(reqs), f.TracesName())
	root, err := FindRepoRoot()
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 2
	}
	tmp, err := os.MkdirTemp("", "tandem-demo-bin-")
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	pkgs := []string{RunnerPackage}
	what := "the demo runner"
	if f.EPPBinary == "" {
		pkgs = append(pkgs, EPPPackage)
		what = "Tandem (" + EPPPackage + ") and the demo runner"
	}
	// The demo's Tandem reads an endpoints file: built with -tags nokube it links no Kubernetes
	// client (about half the packages of a full build).
	err = Build(ctx, BuildOptions{Root: root, OutDir: tmp, Packages: pkgs, What: what, Tags: []string{"nokube"},
		LDFlags: version.LDFlags(version.Stamped()), Progress: stderr, TTY: IsTerminal(stderr)})
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case interrupted:
		fmt.Fprintln(stderr, "demo: interrupted during the build")
		return 130
	case err != nil:
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	runArgs := args
	if f.EPPBinary == "" {
		runArgs = append(append([]string{}, args...), "--epp-binary", filepath.Join(tmp, "epp"))
	}
	return runChild(filepath.Join(tmp, "runner"), runArgs, stdout, stderr)
}

// runChild runs the runner in the foreground and returns its exit code. Ctrl-C reaches it
// from the terminal (same process group); a SIGTERM sent to the launcher is passed on.
func runChild(bin string, args []string, stdout, stderr io.Writer) int {
	cmd := exec.Command(bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGTERM {
				_ = cmd.Process.Signal(s)
			}
		case err := <-done:
			var exit *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &exit) && exit.ExitCode() >= 0:
				return exit.ExitCode()
			default:
				fmt.Fprintln(stderr, "demo: the runner:", err)
				return 1
			}
		}
	}
}

// BuildOptions configure Build.
type BuildOptions struct {
	Root     string   // module root, where go runs
	OutDir   string   // binaries land here, named after their package directory
	Packages []string // main packages, relative to Root
	What     string   // for the progress line
	Tags     []string // build tags
	LDFlags  string
	Progress io.Writer
	TTY      bool // redraw the progress line in place; otherwise a line every 10s
}

// Build compiles the packages with one `go build` and reports progress: first the module
// download (on a fresh machine), then packages compiled out of those not in the build cache.
func Build(ctx context.Context, o BuildOptions) error {
	start := time.Now()
	p := &progressLine{w: o.Progress, tty: o.TTY, start: start}
	p.printf("Preparing the build of %s (modules come from the Go module proxy on the first run) …", o.What)
	total, err := countStale(ctx, o, p)
	if err != nil {
		return err
	}
	args := []string{"build", "-v", "-trimpath", "-o", o.OutDir + string(filepath.Separator)}
	if len(o.Tags) > 0 {
		args = append(args, "-tags", strings.Join(o.Tags, ","))
	}
	if o.LDFlags != "" {
		args = append(args, "-ldflags", o.LDFlags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, o.Packages...)...)
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	compiled := 0
	var tail []string // last lines that are not package names, for the error
	// The clock keeps moving while one large package compiles (k8s.io/api/core/v1 takes minutes
	// on a busy 2-core machine), and the line names it, so a still count is not a hang.
	stopTick := p.ticking()
	defer stopTick()
	p.update("Building %s: %d packages to compile (the build cache holds the rest)", o.What, total)
	err = streamLines(cmd, func(line string) {
		if strings.HasPrefix(line, "#") || strings.Contains(line, ": ") || strings.Contains(line, " ") {
			tail = append(tail, line)
			if len(tail) > 40 {
				tail = tail[1:]
			}
			return
		}
		compiled++
		total = max(total, compiled) // the count is go's own forecast; never show more done than planned
		p.update("Building %s: %d of %d packages compiled (now %s)", o.What, compiled, total, line)
	})
	stopTick()
	if err != nil {
		p.done()
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(o.Packages, " "), err, strings.Join(tail, "\n"))
	}
	p.update("Built %s (%d packages compiled, the rest cached)", o.What, compiled)
	p.done()
	return nil
}

// countStale counts the packages the build will compile: those it needs that the build cache
// does not hold. Listing downloads the missing modules, which `go` reports one "go: downloading"
// line each.
func countStale(ctx context.Context, o BuildOptions, p *progressLine) (int, error) {
	args := []string{"list", "-deps", "-f", "{{if .Stale}}{{.ImportPath}}{{end}}"}
	if len(o.Tags) > 0 {
		args = append(args, "-tags", strings.Join(o.Tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, o.Packages...)...)
	cmd.Dir = o.Root
	var out strings.Builder
	cmd.Stdout = &out
	downloads := 0
	var tail []string
	err := streamLines(cmd, func(line string) {
		if strings.HasPrefix(line, "go: downloading ") {
			downloads++
			p.update("Downloading modules: %d so far (%s)", downloads, strings.TrimPrefix(line, "go: downloading "))
			return
		}
		tail = append(tail, line)
	})
	if err != nil {
		p.done()
		return 0, fmt.Errorf("go list -deps %s: %w\n%s", strings.Join(o.Packages, " "), err, strings.Join(tail, "\n"))
	}
	if downloads > 0 {
		p.update("Downloaded %d modules", downloads)
		p.done()
	}
	return len(strings.Fields(out.String())), nil
}

// streamLines runs cmd and hands each line of its stderr to f as it comes.
func streamLines(cmd *exec.Cmd, f func(string)) error {
	r, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f(sc.Text())
	}
	return cmd.Wait()
}

// progressLine prints a status line: redrawn in place on a terminal, else at most every 10s.
// Its methods may be called from the build's line reader and its clock at once.
type progressLine struct {
	mu      sync.Mutex
	w       io.Writer
	tty     bool
	start   time.Time
	last    time.Time
	text    string // the current status, without the clock
	pending string
}

func (p *progressLine) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *progressLine) update(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.text = fmt.Sprintf(format, args...)
	p.render()
}

// render prints the current status with the elapsed time. Callers hold p.mu.
func (p *progressLine) render() {
	line := p.text + fmt.Sprintf(" [%s]", time.Since(p.start).Round(time.Second))
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\033[K", line)
		return
	}
	p.pending = line
	if time.Since(p.last) >= 10*time.Second {
		fmt.Fprintln(p.w, line)
		p.last, p.pending = time.Now(), ""
	}
}

// ticking redraws the status every second (on a terminal; otherwise render's 10 s limit
// applies) until the returned stop is called; stop may be called more than once.
func (p *progressLine) ticking() (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				p.mu.Lock()
				if p.text != "" {
					p.render()
				}
				p.mu.Unlock()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

// done ends the line: a newline on a terminal, the last unprinted update otherwise.
func (p *progressLine) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintln(p.w)
		return
	}
	if p.pending != "" {
		fmt.Fprintln(p.w, p.pending)
		p.pending = ""
	}
}

// IsTerminal reports whether w is a character device (a terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// FindRepoRoot walks up from the working directory to Tandem's go.mod.
func FindRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if isTandemRoot(dir) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the Tandem repository (no go.mod with module github.com/tandem-epp/tandem above the working directory): run make demo from the clone")
		}
		dir = parent
	}
}

func isTandemRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	return sc.Scan() && strings.TrimSpace(sc.Text()) == "module github.com/tandem-epp/tandem"
}
