// Package version names the build of a Cablemesh binary, for `cablectl version` and the status
// and broker replies that carry it.
package version

import (
	"runtime/debug"
	"strings"
)

// Version can be set at link time (-ldflags "-X github.com/cablemesh/cablemesh/internal/version.Version=v1.2.3");
// empty, String derives the build from what the Go toolchain stamped into the binary.
var Version = ""

// String is the build: Version when set, else the module version and the VCS revision the Go
// toolchain recorded (e.g. "(devel) 1d26001c4e5a+dirty"), else "unknown".
func String() string {
	if Version != "" {
		return Version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return fromBuildInfo(info)
}

// fromBuildInfo is String's pure part.
func fromBuildInfo(info *debug.BuildInfo) string {
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	parts := []string{}
	if v := info.Main.Version; v != "" {
		parts = append(parts, v)
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if modified == "true" {
			// A build from a tree with uncommitted changes is not the commit it names.
			rev += "+dirty"
		}
		parts = append(parts, rev)
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, " ")
}
