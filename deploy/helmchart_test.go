package deploy

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelmChartIsGenerated fails while deploy/helm/cablemesh is not what `go generate ./deploy`
// writes from the embedded templates: a template edited without regenerating, or a chart file
// edited by hand, or one left over.
func TestHelmChartIsGenerated(t *testing.T) {
	want, err := HelmChart()
	if err != nil {
		t.Fatal(err)
	}
	onDisk := map[string]bool{}
	err = filepath.WalkDir(HelmChartDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(HelmChartDir, p)
		onDisk[filepath.ToSlash(rel)] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range want {
		have, err := os.ReadFile(filepath.Join(HelmChartDir, name))
		if err != nil {
			t.Errorf("%s: %v; run go generate ./deploy", name, err)
			continue
		}
		if !bytes.Equal(have, data) {
			t.Errorf("%s is not what go generate ./deploy writes from the templates; run it", name)
		}
	}
	for name := range onDisk {
		if _, ok := want[name]; !ok {
			t.Errorf("%s/%s is not generated; remove it or generate it", HelmChartDir, name)
		}
	}
}

// TestHelmChartLeavesNoMarker: every marker value and placeholder became a template expression,
// and every value the chart documents is used by some template.
func TestHelmChartLeavesNoMarker(t *testing.T) {
	chart, err := HelmChart()
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for name, data := range chart {
		if strings.HasPrefix(name, "templates/") {
			all.Write(data)
		}
	}
	for _, m := range []string{"zzhelm", placeholderPrefix, "198.51.100.", "203.0.113."} {
		if strings.Contains(all.String(), m) {
			t.Errorf("a template still has the marker %q", m)
		}
	}
	for _, v := range []string{".Values.cluster", ".Values.broker", ".Values.podCIDRs", ".Values.serviceCIDRs",
		".Values.image.repository", ".Values.image.tag", ".Values.image.pullPolicy", ".Values.gateway.nodeSelector",
		".Values.workers.enabled", ".Values.joinToken.existingSecret", ".Values.joinToken.key", ".Values.cableDrivers",
		".Values.tolerations", ".Values.resources", ".Values.ingress.envoy.enabled",
		".Values.ingress.envoy.image.repository", ".Values.ingress.envoy.image.tag"} {
		if !strings.Contains(all.String(), v) {
			t.Errorf("no template uses %s", v)
		}
	}
}

// TestHelmChartRefusesTemplatesItCannotExpress: the generator fails, rather than writing a chart
// that renders something else than cablectl, when a template's default is not the chart's.
func TestHelmChartRefusesTemplatesItCannotExpress(t *testing.T) {
	d, err := readChartDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := configTemplate("cableDrivers: [wireguard,vxlan]\n", d); err == nil || !strings.Contains(err.Error(), "cableDrivers") {
		t.Errorf("a cableDrivers line written otherwise: error %v, want one naming it", err)
	}
	pod := map[string]any{"tolerations": []any{map[string]any{"operator": "Exists"}}}
	if err := placePodValues(pod, &placeholders{}, d); err == nil || !strings.Contains(err.Error(), "tolerations") {
		t.Errorf("other tolerations: error %v, want one naming them", err)
	}
}
