package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxNodes bounds the YAML nodes visited per document, so aliases cannot
// make a small file expensive to decode.
const maxNodes = 100_000

// DecodeYAML reads one or more ClusterConnectionPolicy documents (separated
// by "---"; empty documents are skipped). Decoding is strict: unknown fields,
// duplicate keys, wrong kinds and invalid values are errors naming the field,
// its line and the document. Every policy is validated; names must be unique
// within the file. JSON is YAML, so a JSON document decodes too.
//
// Warnings from DecodeYAMLWithWarnings (re-indented priority lines) are dropped.
func DecodeYAML(data []byte) ([]ClusterConnectionPolicy, error) {
	out, _, err := DecodeYAMLWithWarnings(data)
	return out, err
}

// DecodeYAMLWithWarnings is DecodeYAML that also says what it repaired.
//
// The client-server examples of Submariner's connectivity proposal indent `priority: 3` one column deeper
// than the other entries of spec, after a nested block, which is not valid
// YAML. When the YAML does not parse and that is the only indentation problem
// of its spec blocks, those priority lines are moved to the column of spec's
// entries and the file is parsed again; each moved line is a warning naming
// its line. Anything else that does not parse, or a repaired file that still
// does not, is refused with the parser's error for the file as written.
func DecodeYAMLWithWarnings(data []byte) ([]ClusterConnectionPolicy, []string, error) {
	docs, err := parseDocuments(data)
	var warnings []string
	if err != nil {
		fixed, moved := reindentPriority(data)
		if len(moved) == 0 {
			return nil, nil, err
		}
		var err2 error
		if docs, err2 = parseDocuments(fixed); err2 != nil {
			return nil, nil, err
		}
		warnings = moved
	}
	var (
		out   []ClusterConnectionPolicy
		errs  []error
		names = map[string]int{}
	)
	for i, doc := range docs {
		d := &decoder{budget: maxNodes}
		p, ok := d.document(doc)
		if !ok {
			continue
		}
		// Decoding problems and validation problems together, so one run
		// shows everything wrong with the document.
		err := errors.Join(append(d.errs, p.Validate())...)
		label := fmt.Sprintf("document %d", i+1)
		if p.Metadata.Name != "" {
			label += fmt.Sprintf(" (%s)", p.Metadata.Name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", label, err))
			continue
		}
		if first, dup := names[p.Metadata.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: metadata.name: %q is also the name of document %d", label, p.Metadata.Name, first))
			continue
		}
		names[p.Metadata.Name] = i + 1
		// Stored and printed in one spelling, whatever the file said.
		p.Kind, p.APIVersion = Kind, APIVersion
		out = append(out, p)
	}
	if len(errs) > 0 {
		return nil, warnings, errors.Join(errs...)
	}
	return out, warnings, nil
}

func parseDocuments(data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", len(docs)+1, err)
		}
		docs = append(docs, &n)
	}
}

// EncodeYAML writes policies as a multi-document YAML file that DecodeYAML
// reads back to the same policies (status aside).
func EncodeYAML(policies []ClusterConnectionPolicy) ([]byte, error) {
	if len(policies) == 0 {
		return nil, nil // the yaml encoder cannot close an empty stream
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	for i := range policies {
		p := policies[i]
		if p.APIVersion == "" {
			p.APIVersion = APIVersion
		}
		p.Kind = Kind
		if err := enc.Encode(&p); err != nil {
			return nil, fmt.Errorf("encode policy %q: %w", p.Metadata.Name, err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

type decoder struct {
	errs   []error
	budget int
}

func (d *decoder) fail(n *yaml.Node, field, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	d.errs = append(d.errs, &FieldError{Field: field, Detail: fmt.Sprintf(format, args...), Line: line})
}

// resolve follows aliases and charges the node budget.
func (d *decoder) resolve(n *yaml.Node, field string) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	d.budget--
	if d.budget < 0 {
		if d.budget == -1 {
			d.fail(n, field, "document too large or too deeply aliased")
		}
		return nil
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// hasLocalTag reports a tag like "!production" (not "!!str" and not the
// non-specific "!"), which YAML parses as a tag on an empty value.
func hasLocalTag(n *yaml.Node) bool {
	return strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!") && n.Tag != "!"
}

// mapping walks a mapping node, rejecting duplicate keys and calling field
// for each key/value. A null node is an empty mapping.
func (d *decoder) mapping(n *yaml.Node, path string, field func(key string, k, v *yaml.Node)) {
	n = d.resolve(n, path)
	if n == nil || isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "want a mapping, got %s", describe(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := d.resolve(n.Content[i], path)
		v := n.Content[i+1]
		if k == nil {
			return
		}
		if k.Kind != yaml.ScalarNode {
			d.fail(k, path, "want a string key, got %s", describe(k))
			continue
		}
		if seen[k.Value] {
			d.fail(k, join(path, k.Value), "duplicate key")
			continue
		}
		seen[k.Value] = true
		field(k.Value, k, v)
	}
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// scalar returns a scalar's text; null is "". Local tags are refused: they
// mean something only in selector values.
func (d *decoder) scalar(n *yaml.Node, path string) (string, bool) {
	n = d.resolve(n, path)
	if n == nil {
		return "", false
	}
	if n.Kind != yaml.ScalarNode {
		d.fail(n, path, "want a single value, got %s", describe(n))
		return "", false
	}
	if hasLocalTag(n) {
		d.fail(n, path, "unexpected YAML tag %q (quote the value if it starts with '!')", n.Tag)
		return "", false
	}
	if isNull(n) {
		return "", true
	}
	return n.Value, true
}

func (d *decoder) stringMap(n *yaml.Node, path string) map[string]string {
	var out map[string]string
	d.mapping(n, path, func(key string, _, v *yaml.Node) {
		s, ok := d.scalar(v, join(path, key))
		if !ok {
			return
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = s
	})
	return out
}

// document decodes one document; ok is false for an empty document.
func (d *decoder) document(doc *yaml.Node) (p ClusterConnectionPolicy, ok bool) {
	n := doc
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return p, false
		}
		n = n.Content[0]
	}
	if isNull(n) {
		return p, false
	}
	var sawKind bool
	d.mapping(n, "", func(key string, k, v *yaml.Node) {
		switch key {
		case "apiVersion":
			p.APIVersion, _ = d.scalar(v, key)
		case "kind":
			sawKind = true
			p.Kind, _ = d.scalar(v, key) // checked by Validate
		case "metadata":
			d.mapping(v, key, func(mk string, mkn, mv *yaml.Node) {
				switch mk {
				case "name":
					p.Metadata.Name, _ = d.scalar(mv, "metadata.name")
				case "labels":
					p.Metadata.Labels = d.stringMap(mv, "metadata.labels")
				default:
					d.fail(mkn, "metadata."+mk, "unknown field (want name, labels)")
				}
			})
		case "spec":
			d.spec(v, &p.Spec)
		case "origin":
			p.Origin, _ = d.scalar(v, key)
		case "status":
			// Written by the broker; accepted so that an exported file applies
			// again, and ignored as kubectl apply ignores it.
		default:
			d.fail(k, key, "unknown field (want apiVersion, kind, metadata, spec)")
		}
	})
	if n.Kind == yaml.MappingNode && (!sawKind || p.Kind == "") {
		d.fail(n, "kind", "required (%s)", Kind)
	}
	return p, true
}

func (d *decoder) spec(n *yaml.Node, s *Spec) {
	d.mapping(n, "spec", func(key string, k, v *yaml.Node) {
		path := "spec." + key
		switch key {
		case "leftClusterSelector":
			s.LeftClusterSelector = d.selector(v, path)
		case "rightClusterSelector":
			s.RightClusterSelector = d.selector(v, path)
		case "clusterSelector":
			s.ClusterSelector = d.selector(v, path)
		case "topology":
			s.Topology, _ = d.scalar(v, path)
		case "connectionPolicy":
			s.ConnectionPolicy, _ = d.scalar(v, path)
		case "priority":
			text, ok := d.scalar(v, path)
			if !ok || text == "" {
				return
			}
			prio, err := strconv.Atoi(text)
			if err != nil {
				d.fail(v, path, "%q is not an integer", text)
				return
			}
			s.Priority = &prio
		case "cableDriver":
			vv := d.resolve(v, path)
			if vv == nil || isNull(vv) {
				return
			}
			cd := &CableDriver{}
			d.mapping(vv, path, func(ck string, ckn, cv *yaml.Node) {
				switch ck {
				case "name":
					cd.Name, _ = d.scalar(cv, path+".name")
				case "options":
					cd.Options = d.stringMap(cv, path+".options")
				default:
					d.fail(ckn, path+"."+ck, "unknown field (want name, options)")
				}
			})
			s.CableDriver = cd
		case "final":
			text, ok := d.scalar(v, path)
			if !ok || text == "" {
				return
			}
			if text != "true" && text != "false" {
				d.fail(v, path, "%q is not true or false", text)
				return
			}
			s.Final = text == "true"
		default:
			d.fail(k, path, "unknown field (want leftClusterSelector, rightClusterSelector, clusterSelector, topology, priority, connectionPolicy, cableDriver, final)")
		}
	})
}

// selector decodes either form of a selector. Present-but-null is the empty
// selector, which matches every cluster.
func (d *decoder) selector(n *yaml.Node, path string) *Selector {
	sel := &Selector{}
	n = d.resolve(n, path)
	if n == nil || isNull(n) {
		return sel
	}
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "want a mapping of labels, got %s", describe(n))
		return sel
	}
	structured := false
	for i := 0; i < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind == yaml.ScalarNode && (k.Value == "matchLabels" || k.Value == "matchExpressions") {
			structured = true
		}
	}
	if !structured {
		// The proposal's shorthand: labels directly under the selector.
		d.mapping(n, path, func(key string, _, v *yaml.Node) {
			if value, ok := d.labelValue(v, join(path, key)); ok {
				sel.addLabel(key, value)
			}
		})
		return sel
	}
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		switch key {
		case "matchLabels":
			d.mapping(v, path+".matchLabels", func(lk string, _, lv *yaml.Node) {
				if value, ok := d.labelValue(lv, path+".matchLabels."+lk); ok {
					sel.addLabel(lk, value)
				}
			})
		case "matchExpressions":
			d.expressions(v, path+".matchExpressions", sel)
		default:
			d.fail(k, join(path, key), "unknown field (want matchLabels, matchExpressions)")
		}
	})
	return sel
}

// labelValue reads a label value; the proposal's `env: !production` arrives as
// the local tag "!production" on an empty scalar and comes back as
// "!production", which addLabel turns into NotIn.
func (d *decoder) labelValue(n *yaml.Node, path string) (string, bool) {
	n = d.resolve(n, path)
	if n == nil {
		return "", false
	}
	if n.Kind == yaml.ScalarNode && hasLocalTag(n) {
		if n.Value != "" {
			d.fail(n, path, "YAML tag %q followed by %q: write `!value` alone for \"not value\", or quote the value", n.Tag, n.Value)
			return "", false
		}
		return n.Tag, true
	}
	return d.scalar(n, path)
}

func (d *decoder) expressions(n *yaml.Node, path string, sel *Selector) {
	n = d.resolve(n, path)
	if n == nil || isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "want a list, got %s", describe(n))
		return
	}
	for i, item := range n.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		var r requirementJSON
		d.mapping(item, ipath, func(key string, k, v *yaml.Node) {
			switch key {
			case "key":
				r.Key, _ = d.scalar(v, ipath+".key")
			case "operator":
				r.Operator, _ = d.scalar(v, ipath+".operator")
			case "values":
				vv := d.resolve(v, ipath+".values")
				if vv == nil || isNull(vv) {
					return
				}
				if vv.Kind != yaml.SequenceNode {
					d.fail(vv, ipath+".values", "want a list, got %s", describe(vv))
					return
				}
				for j, e := range vv.Content {
					if s, ok := d.scalar(e, fmt.Sprintf("%s.values[%d]", ipath, j)); ok {
						r.Values = append(r.Values, s)
					}
				}
			default:
				d.fail(k, ipath+"."+key, "unknown field (want key, operator, values)")
			}
		})
		sel.MatchExpressions = append(sel.MatchExpressions, toRequirement(r))
	}
}

// UnmarshalYAML lets a Selector inside someone else's YAML document (a
// config file, say) decode with the same rules as DecodeYAML.
func (s *Selector) UnmarshalYAML(n *yaml.Node) error {
	d := &decoder{budget: maxNodes}
	sel := d.selector(n, "selector")
	if err := errors.Join(append(d.errs, sel.Validate("selector"))...); err != nil {
		return err
	}
	*s = *sel
	return nil
}
