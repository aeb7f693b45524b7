package deploy

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// tagPaths lists the dotted tag paths of a struct type's fields ("wireguard.port"), recursing into
// nested structs except those in leaf (types documented as one value, e.g. time.Time).
func tagPaths(t reflect.Type, tag, prefix string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get(tag), ",")
		if name == "" || name == "-" {
			continue
		}
		path := prefix + name
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() != "time" {
			out = append(out, tagPaths(ft, tag, path+".")...)
			continue
		}
		out = append(out, path)
	}
	return out
}

// TestReadmeDocumentsEveryAgentConfigField keeps docs/agent-config.md's field table in step with
// agent/config: every field (by its YAML name, nested ones dotted) must appear as `name`.
func TestReadmeDocumentsEveryAgentConfigField(t *testing.T) {
	readme, err := os.ReadFile("../docs/agent-config.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tagPaths(reflect.TypeOf(config.Config{}), "yaml", "") {
		if !strings.Contains(string(readme), "| `"+p+"` |") {
			t.Errorf("docs/agent-config.md's field table has no row for `%s`", p)
		}
	}
}

// TestReadmeDocumentsStatusJSONKeys keeps docs/status.md's status key list in step with
// agent/statusapi: every top-level and broker key, and every connection key, is named.
func TestReadmeDocumentsStatusJSONKeys(t *testing.T) {
	readme, err := os.ReadFile("../docs/status.md")
	if err != nil {
		t.Fatal(err)
	}
	st := reflect.TypeOf(statusapi.Status{})
	var keys []string
	for i := 0; i < st.NumField(); i++ {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		keys = append(keys, name)
	}
	keys = append(keys, tagPaths(reflect.TypeOf(statusapi.Broker{}), "json", "broker.")...)
	cn := reflect.TypeOf(statusapi.Connection{})
	for i := 0; i < cn.NumField(); i++ {
		name, _, _ := strings.Cut(cn.Field(i).Tag.Get("json"), ",")
		keys = append(keys, "."+name)
	}
	for _, k := range keys {
		if !strings.Contains(string(readme), "`"+k+"`") {
			t.Errorf("docs/status.md's status JSON table does not name `%s`", k)
		}
	}
}
