package benchresults

import (
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// What the benches share besides Save: their knobs from the environment, the medians they report,
// and the facts about the host they record beside them.

// EnvInt is the positive integer in environment variable name, else def.
func EnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// Median is the median of xs (the mean of the middle two for an even count), NaN for none; xs is
// not reordered.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// FirstLine is the first non-empty line, trimmed, of what the command name args prints (stdout
// and stderr), "" if it prints none or does not run: a tool's version for the results.
func FirstLine(name string, args ...string) string {
	out, _ := exec.Command(name, args...).CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}

// LoadAvg is /proc/loadavg, trimmed: the host's load when a bench started and ended.
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}
