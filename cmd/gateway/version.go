package main

import (
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/switchboard-gw/switchboard/internal/version"
)

// errVersion is what loadConfig, and so run, returns for --version, before
// any configuration is read: main then prints versionLine to stdout and
// exits 0, the way pflag.ErrHelp ends --help.
var errVersion = errors.New("version requested")

// versionLine is the --version output for this binary, one line without
// a newline; see formatVersion.
func versionLine() string {
	bi, _ := debug.ReadBuildInfo()
	return formatVersion(bi, runtime.Version())
}

// pseudoVersion matches the tail of a Go pseudo-version
// (v0.0.0-20260101120000-abcdef123456), which the go command stamps on a
// build from an untagged commit.
var pseudoVersion = regexp.MustCompile(`\d{14}-[0-9a-f]{12}$`)

// formatVersion renders the --version line from the build information bi
// (nil when the binary has none) and the Go version goVersion:
//
//	switchboard v0.1.0 (commit 257c0f0, go1.26.8)
//	switchboard v0.1.0 (commit 257c0f0-dirty, go1.26.8)   uncommitted changes
//	switchboard v0.1.0 (devel, go1.26.8)                  no VCS information
//
// The version is the main module's when it is a release tag (a binary
// built by `go install ...@v0.2.0`), else "v" + version.Version, the
// project's version (a release build may stamp it with -ldflags -X). The commit is the first 7 characters of
// vcs.revision, with "-dirty" when vcs.modified is true.
func formatVersion(bi *debug.BuildInfo, goVersion string) string {
	v, build := "v"+version.Version, "devel"
	if bi != nil {
		if mv := bi.Main.Version; strings.HasPrefix(mv, "v") && !strings.Contains(mv, "+") && !pseudoVersion.MatchString(mv) {
			v = mv
		}
		var revision, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if revision != "" {
			build = "commit " + revision[:min(len(revision), 7)]
			if modified == "true" {
				build += "-dirty"
			}
		}
	}
	return fmt.Sprintf("switchboard %s (%s, %s)", v, build, goVersion)
}
