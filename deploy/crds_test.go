package deploy

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"
	"sigs.k8s.io/yaml"

	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/drivers"
	"github.com/cablemesh/cablemesh/policy"
)

// crd decodes one of deploy/crds into the real apiextensions/v1 type, strictly.
func crd(t *testing.T, file string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("crds", file))
	if err != nil {
		t.Fatal(err)
	}
	var c apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return &c
}

// internalCRD converts to the internal type the API server's own validation takes.
func internalCRD(t *testing.T, c *apiextensionsv1.CustomResourceDefinition) *apiextensions.CustomResourceDefinition {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := apiextensions.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// As the API server does: defaults first (listKind...), and the stored version recorded.
	c = c.DeepCopy()
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(c)
	for _, v := range c.Spec.Versions {
		if v.Storage {
			c.Status.StoredVersions = []string{v.Name}
		}
	}
	var out apiextensions.CustomResourceDefinition
	if err := scheme.Convert(c, &out, nil); err != nil {
		t.Fatalf("convert %s: %v", c.Name, err)
	}
	return &out
}

var crdFiles = []string{
	"cablemesh.io_clusterconnectionpolicies.yaml",
	"cablemesh.io_clusterlinks.yaml",
	"multicluster.x-k8s.io_serviceexports.yaml",
	"multicluster.x-k8s.io_serviceimports.yaml",
}

// TestCRDsPassTheAPIServersValidation runs the API server's own CRD validation (structural schema,
// CEL rules compiled, names, versions) on every CRD, as `kubectl apply` to a real server would.
func TestCRDsPassTheAPIServersValidation(t *testing.T) {
	for _, f := range crdFiles {
		t.Run(f, func(t *testing.T) {
			c := internalCRD(t, crd(t, f))
			if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), c); len(errs) > 0 {
				t.Fatalf("the API server would refuse %s: %v", f, errs.ToAggregate())
			}
		})
	}
}

// TestMCSCRDsAreTheModulesOwn keeps the copies in deploy/crds identical to those of the
// sigs.k8s.io/mcs-api version in go.mod (whose types agent/kube uses): kustomize needs them on
// disk, go:embed cannot reach the module cache.
func TestMCSCRDsAreTheModulesOwn(t *testing.T) {
	for file, want := range map[string][]byte{
		"multicluster.x-k8s.io_serviceexports.yaml": mcscrd.ServiceExportCRD,
		"multicluster.x-k8s.io_serviceimports.yaml": mcscrd.ServiceImportCRD,
	} {
		got, err := os.ReadFile(filepath.Join("crds", file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("crds/%s differs from sigs.k8s.io/mcs-api's: copy it again from the module cache", file)
		}
	}
}

// policyValidator validates objects against the ClusterConnectionPolicy CRD's schema and its CEL
// rules, as the API server does on create.
type policyValidator struct {
	schema validation.SchemaValidator
	cel    *cel.Validator
	s      *schema.Structural
}

func newPolicyValidator(t *testing.T) policyValidator {
	t.Helper()
	c := internalCRD(t, crd(t, crdFiles[0]))
	// One version: the conversion keeps its schema as the CRD's top-level validation.
	if len(c.Spec.Versions) != 1 || c.Spec.Validation == nil {
		t.Fatalf("want one version with a schema, have %+v", c.Spec.Versions)
	}
	props := c.Spec.Validation.OpenAPIV3Schema
	sv, _, err := validation.NewSchemaValidator(props)
	if err != nil {
		t.Fatal(err)
	}
	s, err := schema.NewStructural(props)
	if err != nil {
		t.Fatal(err)
	}
	cv := cel.NewValidator(s, true, 1_000_000)
	if cv == nil {
		t.Fatal("the CRD has CEL rules but no validator was built for them")
	}
	return policyValidator{schema: sv, cel: cv, s: s}
}

func (v policyValidator) validate(obj map[string]any) field.ErrorList {
	errs := validation.ValidateCustomResource(nil, obj, v.schema)
	celErrs, _ := v.cel.Validate(context.Background(), nil, v.s, obj, nil, 1_000_000)
	return append(errs, celErrs...)
}

// seedAsCRD reads one of the examples of Submariner's connectivity proposal as the proposal writes them (policy/testdata/seed004)
// and makes it an object of our CRD: the apiVersion and kind kubectl needs, nothing else changed.
// Two of the proposal's examples indent `priority` one column too deep, which no YAML parser reads;
// it is moved back, as the policy decoder does (policy/reindent.go).
func seedAsCRD(t *testing.T, file string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "policy", "testdata", "seed004", file))
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.ReplaceAll(data, []byte("\n   priority:"), []byte("\n  priority:"))
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	obj["apiVersion"] = "cablemesh.io/v1alpha1"
	obj["kind"] = "ClusterConnectionPolicy"
	return obj
}

func TestPolicyCRDAcceptsEverySeed004Example(t *testing.T) {
	v := newPolicyValidator(t)
	files, err := filepath.Glob(filepath.Join("..", "policy", "testdata", "seed004", "*.yaml"))
	if err != nil || len(files) != 8 {
		t.Fatalf("want the seed's 8 examples, found %d (%v)", len(files), err)
	}
	for _, f := range files {
		f := filepath.Base(f)
		t.Run(f+" as the seed writes it", func(t *testing.T) {
			if errs := v.validate(seedAsCRD(t, f)); len(errs) > 0 {
				t.Errorf("refused: %v", errs.ToAggregate())
			}
		})
		t.Run(f+" as cablectl connection-policy export prints it", func(t *testing.T) {
			// The canonical form (selectors as matchLabels/matchExpressions) that the agent
			// syncs and `export` prints must pass too.
			data, err := os.ReadFile(filepath.Join("..", "policy", "testdata", "seed004", f))
			if err != nil {
				t.Fatal(err)
			}
			ps, err := policy.DecodeYAML(data)
			if err != nil {
				t.Fatal(err)
			}
			out, err := policy.EncodeYAML(ps)
			if err != nil {
				t.Fatal(err)
			}
			var obj map[string]any
			if err := yaml.Unmarshal(out, &obj); err != nil {
				t.Fatal(err)
			}
			if errs := v.validate(obj); len(errs) > 0 {
				t.Errorf("refused %s: %v", out, errs.ToAggregate())
			}
		})
	}
}

func TestPolicyCRDRefusesBadPolicies(t *testing.T) {
	v := newPolicyValidator(t)
	base := func() map[string]any { return seedAsCRD(t, "03-on-prem.yaml") }
	spec := func(o map[string]any) map[string]any { return o["spec"].(map[string]any) }
	tests := []struct {
		name   string
		change func(o map[string]any)
		want   string // in the error
	}{
		{"an unknown topology", func(o map[string]any) { spec(o)["topology"] = "star" }, "spec.topology"},
		{"a priority that is not a number", func(o map[string]any) { spec(o)["priority"] = "high" }, "spec.priority"},
		{"a connection policy other than connect or no-connect", func(o map[string]any) { spec(o)["connectionPolicy"] = "maybe" }, "spec.connectionPolicy"},
		{"a cable driver without a name", func(o map[string]any) { spec(o)["cableDriver"] = map[string]any{} }, "spec.cableDriver.name"},
		{"an unregistered cable driver", func(o map[string]any) { spec(o)["cableDriver"] = map[string]any{"name": "gre"} }, "spec.cableDriver.name"},
		{"a driver option that is not a string", func(o map[string]any) {
			spec(o)["cableDriver"] = map[string]any{"name": "vxlan", "options": map[string]any{"port": int64(4789)}}
		}, "spec.cableDriver.options.port"},
		{"a matchExpressions operator Kubernetes does not know", func(o map[string]any) {
			spec(o)["clusterSelector"] = nil
			spec(o)["leftClusterSelector"] = map[string]any{"matchExpressions": []any{map[string]any{"key": "env", "operator": "Like"}}}
		}, "spec.leftClusterSelector.matchExpressions[0].operator"},
		{"clusterSelector mixed with leftClusterSelector", func(o map[string]any) { spec(o)["clusterSelector"] = map[string]any{"env": "x"} }, "clusterSelector cannot be combined"},
		{"a no-connect policy with a cable driver", func(o map[string]any) { spec(o)["connectionPolicy"] = "no-connect" }, "no-connect policy takes no cableDriver"},
		{"no spec", func(o map[string]any) { delete(o, "spec") }, "spec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base()
			if errs := v.validate(o); len(errs) > 0 {
				t.Fatalf("the unchanged example is refused: %v", errs.ToAggregate())
			}
			tt.change(o)
			errs := v.validate(o)
			if len(errs) == 0 {
				t.Fatalf("accepted: %v", o)
			}
			if msg := errs.ToAggregate().Error(); !strings.Contains(msg, tt.want) {
				t.Errorf("refused, but the error does not name %q: %s", tt.want, msg)
			}
		})
	}
}

// TestPolicyCRDDriverEnumIsTheRegistry keeps the schema's driver names those the binaries link.
func TestPolicyCRDDriverEnumIsTheRegistry(t *testing.T) {
	c := crd(t, crdFiles[0])
	name := c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["cableDriver"].Properties["name"]
	var got []string
	for _, e := range name.Enum {
		var s string
		if err := yaml.Unmarshal(e.Raw, &s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	slices.Sort(got)
	if want := cable.Names(); !slices.Equal(got, want) {
		t.Errorf("spec.cableDriver.name enum %q, registered drivers %q", got, want)
	}
}
