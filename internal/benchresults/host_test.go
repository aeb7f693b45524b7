package benchresults

import (
	"math"
	"slices"
	"testing"
)

func TestMedianOfOddEvenAndNoValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"an odd count gives the middle value", []float64{3, 1, 2}, 2},
		{"an even count gives the mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"one value is its own median", []float64{7}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.xs)
			if got := Median(tc.xs); got != tc.want {
				t.Errorf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
			}
			if !slices.Equal(in, tc.xs) {
				t.Errorf("Median reordered its input: %v, was %v", tc.xs, in)
			}
		})
	}
	if got := Median(nil); !math.IsNaN(got) {
		t.Errorf("Median(nil) = %v, want NaN", got)
	}
}

func TestEnvIntTakesOnlyAPositiveInteger(t *testing.T) {
	const name = "CABLEMESH_BENCHRESULTS_TEST_INT"
	for _, tc := range []struct {
		value string
		want  int
	}{{"12", 12}, {"", 5}, {"0", 5}, {"-3", 5}, {"x", 5}} {
		t.Setenv(name, tc.value)
		if got := EnvInt(name, 5); got != tc.want {
			t.Errorf("EnvInt with %s=%q = %d, want %d", name, tc.value, got, tc.want)
		}
	}
}

func TestFirstLineSkipsBlankLinesAndToleratesAMissingTool(t *testing.T) {
	if got := FirstLine("sh", "-c", `printf '\n  \n  v1.2  \nmore\n'`); got != "v1.2" {
		t.Errorf("FirstLine = %q, want %q", got, "v1.2")
	}
	if got := FirstLine("cablemesh-no-such-tool"); got != "" {
		t.Errorf("FirstLine of a missing tool = %q, want empty", got)
	}
}
