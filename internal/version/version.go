// Package version says which build of Tandem is running: the version and commit stamped at
// build time from git (the Makefile and the Dockerfile pass them with -ldflags -X), or, when a
// build was not stamped, what the Go toolchain recorded (the module version of `go install
// …@v1.2.3`, the VCS revision of a `go build` in a git checkout). Every binary's --version
// prints it. It must not import anything beyond the standard library.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Stamped at build time:
//
//	-ldflags "-X github.com/tandem-epp/tandem/internal/version.version=v0.1.0 -X github.com/tandem-epp/tandem/internal/version.commit=<sha>"
var (
	version string
	commit  string
)

// Package is the import path whose variables -X sets.
const Package = "github.com/tandem-epp/tandem/internal/version"

// Info is one build's identity.
type Info struct {
	Version   string // e.g. v0.1.0, v0.1.0-3-gabc1234-dirty, or "devel" when unknown
	Commit    string // full git commit, with "-dirty" for a modified tree; "unknown" when not recorded
	GoVersion string // toolchain that built the binary
	Platform  string // GOOS/GOARCH
}

// Get returns the running binary's Info.
func Get() Info {
	return resolve(version, commit, debug.ReadBuildInfo)
}

func resolve(v, c string, buildInfo func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: v, Commit: c, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := buildInfo(); ok {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			var rev, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if rev != "" && modified == "true" {
				rev += "-dirty"
			}
			info.Commit = rev
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String is the build's identity as --version prints it after the binary's name:
// "v0.1.0 (commit 1a2b3c…, go1.26.8, linux/amd64)".
// A build with neither a version nor a commit (`go run`, which records no VCS information) says
// how to get one.
func (i Info) String() string {
	s := fmt.Sprintf("%s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
	if i.Version == "devel" && i.Commit == "unknown" {
		s += "; not stamped: go run records no version or commit, make build (or go build in a git checkout) does"
	}
	return s
}

// Line is the --version output of the named binary: "epp v0.1.0 (commit …, go1.26.8, linux/amd64)".
func Line(binary string) string { return binary + " " + Get().String() }

// LDFlags is the -ldflags -X argument that stamps version and commit into a build. It is how
// cmd/demo passes its own stamp on to the binaries it builds.
func LDFlags(version, commit string) string {
	var b strings.Builder
	for _, kv := range [][2]string{{"version", version}, {"commit", commit}} {
		if kv[1] == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "-X %s.%s=%s", Package, kv[0], kv[1])
	}
	return b.String()
}

// Stamped returns the version and commit this binary was stamped with ("" when not stamped).
func Stamped() (v, c string) { return version, commit }
