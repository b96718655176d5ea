package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/switchboard-gw/switchboard/internal/version"
)

// TestFormatVersion checks the --version line for each kind of build
// against the version the binary carries (version.Version), then with that
// variable set as a release build's -ldflags "-X ...version.Version=..."
// would set it.
func TestFormatVersion(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	const rev = "257c0f02cc50c28e8f700ecf792946cf5bd5b5e7"
	// Each want holds %s where the project's version goes.
	tests := []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{name: "no build info", want: "switchboard v%s (devel, go1.26.8)"},
		{name: "devel build without VCS", bi: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			want: "switchboard v%s (devel, go1.26.8)"},
		{name: "clean commit", bi: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: vcs("vcs", "git", "vcs.revision", rev, "vcs.modified", "false")},
			want: "switchboard v%s (commit 257c0f0, go1.26.8)"},
		{name: "uncommitted changes", bi: &debug.BuildInfo{
			Main:     debug.Module{Version: "v0.0.0-20261129192126-257c0f02cc50+dirty"},
			Settings: vcs("vcs.revision", rev, "vcs.modified", "true")},
			want: "switchboard v%s (commit 257c0f0-dirty, go1.26.8)"},
		{name: "pseudo-version is not a release", bi: &debug.BuildInfo{
			Main: debug.Module{Version: "v0.1.1-0.20261129192126-257c0f02cc50"}},
			want: "switchboard v%s (devel, go1.26.8)"},
		{name: "release tag", bi: &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"},
			Settings: vcs("vcs.revision", rev)},
			want: "switchboard v0.2.0 (commit 257c0f0, go1.26.8)"},
		{name: "short revision", bi: &debug.BuildInfo{Settings: vcs("vcs.revision", "abc")},
			want: "switchboard v%s (commit abc, go1.26.8)"},
	}
	check := func(t *testing.T, v string) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				want := tc.want
				if strings.Contains(want, "%s") {
					want = fmt.Sprintf(want, v)
				}
				if got := formatVersion(tc.bi, "go1.26.8"); got != want {
					t.Errorf("formatVersion = %q, want %q", got, want)
				}
			})
		}
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+`).MatchString(version.Version) {
		t.Errorf("version.Version = %q, want a semantic version without a leading v", version.Version)
	}
	t.Run("built-in", func(t *testing.T) { check(t, version.Version) })
	t.Run("ldflags", func(t *testing.T) {
		// What -ldflags "-X .../internal/version.Version=9.8.7" sets.
		orig := version.Version
		version.Version = "9.8.7"
		t.Cleanup(func() { version.Version = orig })
		check(t, "9.8.7")
	})
}

// TestVersionFlag checks that --version wins over everything else, reads
// no configuration (a broken one does not matter), starts nothing, and
// that main prints the one line to stdout and returns, so the process
// exits 0.
func TestVersionFlag(t *testing.T) {
	line := versionLine()
	if !regexp.MustCompile(`^switchboard v\S+ \((commit [0-9a-f]+(-dirty)?|devel), ` + regexp.QuoteMeta(runtime.Version()) + `\)$`).MatchString(line) {
		t.Errorf("versionLine() = %q", line)
	}
	// A test binary is no release build: its line carries version.Version.
	if !strings.HasPrefix(line, "switchboard v"+version.Version+" (") {
		t.Errorf("versionLine() = %q, want version %s", line, version.Version)
	}

	broken := []string{"--version", "--config", "/does/not/exist.yaml", "--policy", "nope"}
	if _, err := loadConfig(broken, environ("SWITCHBOARD_SERVR__LISTEN=x")); !errors.Is(err, errVersion) {
		t.Errorf("loadConfig(%q) = %v, want errVersion", broken, err)
	}
	err := run(context.Background(), []string{"--version"}, environ(), io.Discard, func(string, string) {
		t.Error("ready called for --version")
	})
	if !errors.Is(err, errVersion) {
		t.Errorf("run(--version) = %v, want errVersion", err)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, args := os.Stdout, os.Args
	os.Stdout, os.Args = w, []string{"switchboard", "--version"}
	main() // os.Exit(1) here would end the test binary
	os.Stdout, os.Args = stdout, args
	w.Close()
	out, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != line+"\n" {
		t.Errorf("main printed %q, want %q", out, line+"\n")
	}
}

// TestHelpFlag checks that --help still ends with pflag.ErrHelp (main
// exits 0 on it) and prints the usage: the keys subcommand, the flags
// (--version among them) and the environment variables.
func TestHelpFlag(t *testing.T) {
	if _, err := loadConfig([]string{"--help"}, environ()); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("loadConfig(--help) = %v, want pflag.ErrHelp", err)
	}
	if usage := newFlagSet().FlagUsages(); !regexp.MustCompile(`\n\s+--version\S*\s+print the version and exit\n`).MatchString(usage) {
		t.Errorf("usage does not list --version:\n%s", usage)
	}
	fs := newFlagSet()
	var out strings.Builder
	fs.SetOutput(&out)
	if err := fs.Parse([]string{"--help"}); !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("Parse(--help) = %v, want pflag.ErrHelp", err)
	}
	for _, want := range []string{"\n  switchboard [flags] ", "\n  switchboard keys hash < key.txt ", "\n  switchboard keys hash --generate ",
		"\nFlags:\n", "--config string", "--policy string", "SWITCHBOARD_ROUTING__POLICY"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, out.String())
		}
	}
}
