package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/cablemesh/cablemesh/cable"
)

// file is what the YAML document decodes into: the config's own fields, and every other
// top-level key (a driver's block, or an unknown field) kept as a node.
type file struct {
	Config `yaml:",inline"`
	Rest   map[string]yaml.Node `yaml:",inline"`
}

// blockLines are where one driver's block is in the file: the line of its key and of each of
// its settings.
type blockLines struct {
	line int
	keys map[string]int
}

var unknownFieldRE = regexp.MustCompile(`line (\d+): field (\S+) not found in type \S+`)

// Decode parses one YAML document strictly: unknown fields, a second document and an empty
// file are errors. A top-level key that names a registered cable driver is that driver's block
// (Config.Drivers): a mapping of scalars. It applies no defaults.
func Decode(data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f file
	var errs lineErrors
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("config is empty")
		}
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, fmt.Errorf("decode YAML: %w", err)
		}
		errs.addTypeError(te)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("config holds more than one YAML document")
	}
	c := f.Config
	keyLines := topLevelKeyLines(data)
	registered := cable.Names()
	for _, key := range slices.Sorted(maps.Keys(f.Rest)) {
		n := f.Rest[key]
		line := keyLines[key]
		if line == 0 {
			line = n.Line
		}
		if !slices.Contains(registered, key) {
			errs.add(line, fmt.Sprintf("unknown field %q", key))
			continue
		}
		s, lines, err := decodeSettings(key, &n)
		if err != nil {
			errs.add(err.line, err.msg)
			continue
		}
		if c.Drivers == nil {
			c.Drivers = map[string]cable.Settings{}
			c.driverLines = map[string]blockLines{}
		}
		c.Drivers[key] = s
		c.driverLines[key] = blockLines{line: line, keys: lines}
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return &c, nil
}

// decodeSettings turns a driver's block into its settings: a mapping whose values are scalars,
// each kept in its text form (integers in decimal, so `vni: 0x10` reaches the driver as "16";
// null as ""). An empty block is no settings.
func decodeSettings(driver string, n *yaml.Node) (cable.Settings, map[string]int, *lineError) {
	n = deref(n)
	s := cable.Settings{}
	lines := map[string]int{}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return s, lines, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, nil, &lineError{n.Line, fmt.Sprintf("%s: want a mapping of the %s driver's settings, not %s", driver, driver, kindName(n))}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return nil, nil, &lineError{k.Line, fmt.Sprintf("%s: a setting's name must be a scalar, not %s", driver, kindName(k))}
		}
		field := driver + "." + k.Value
		if prev, dup := lines[k.Value]; dup {
			return nil, nil, &lineError{k.Line, fmt.Sprintf("%s: is set twice (first on line %d)", field, prev)}
		}
		if v.Kind != yaml.ScalarNode {
			return nil, nil, &lineError{v.Line, fmt.Sprintf("%s: want a scalar value, not %s", field, kindName(v))}
		}
		s[k.Value] = scalarText(v)
		lines[k.Value] = k.Line
	}
	return s, lines, nil
}

// deref follows an alias to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.ScalarNode:
		return fmt.Sprintf("the scalar %q", n.Value)
	}
	return "an empty node"
}

// scalarText is a scalar's text as a driver reads it: YAML integers in decimal, booleans as
// true/false, null as "", anything else as written.
func scalarText(n *yaml.Node) string {
	switch n.ShortTag() {
	case "!!null":
		return ""
	case "!!int":
		var i int64
		if n.Decode(&i) == nil {
			return strconv.FormatInt(i, 10)
		}
		var u uint64
		if n.Decode(&u) == nil {
			return strconv.FormatUint(u, 10)
		}
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return strconv.FormatBool(b)
		}
	}
	return n.Value
}

// topLevelKeyLines maps each key of the document's top-level mapping to its line.
func topLevelKeyLines(data []byte) map[string]int {
	var doc yaml.Node
	out := map[string]int{}
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return out
	}
	top := deref(doc.Content[0])
	if top.Kind != yaml.MappingNode {
		return out
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		if k := top.Content[i]; k.Kind == yaml.ScalarNode {
			if _, seen := out[k.Value]; !seen {
				out[k.Value] = k.Line
			}
		}
	}
	return out
}

// locate adds to a driver's settings error the line of the setting it names ("<driver>.<key>..."),
// else the line of the block; a config not decoded from a file has no lines.
func (b blockLines) locate(driver string, err error) error {
	msg := err.Error()
	line := b.line
	best := 0
	for k, l := range b.keys {
		p := driver + "." + k
		if len(p) > best && strings.HasPrefix(msg, p) && (len(msg) == len(p) || !isNameByte(msg[len(p)])) {
			line, best = l, len(p)
		}
	}
	if line == 0 {
		return err
	}
	return fmt.Errorf("line %d: %w", line, err)
}

func isNameByte(c byte) bool {
	return c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// lineError is one decoding error at a line of the file.
type lineError struct {
	line int
	msg  string
}

// lineErrors collects decoding errors and reports them in file order.
type lineErrors []lineError

func (e *lineErrors) add(line int, msg string) { *e = append(*e, lineError{line, msg}) }

// addTypeError adds yaml.v3's errors, turning "line 3: field foo not found in type
// config.file" into "line 3: unknown field \"foo\"", which is what an operator needs to read.
func (e *lineErrors) addTypeError(te *yaml.TypeError) {
	for _, m := range te.Errors {
		if sm := unknownFieldRE.FindStringSubmatch(m); sm != nil {
			m = fmt.Sprintf("line %s: unknown field %q", sm[1], sm[2])
		}
		line := 0
		if rest, ok := strings.CutPrefix(m, "line "); ok {
			if n, msg, ok := strings.Cut(rest, ": "); ok {
				if l, err := strconv.Atoi(n); err == nil {
					line, m = l, msg
				}
			}
		}
		e.add(line, m)
	}
}

func (e lineErrors) err() error {
	if len(e) == 0 {
		return nil
	}
	sort.SliceStable(e, func(i, j int) bool { return e[i].line < e[j].line })
	msgs := make([]string, 0, len(e))
	for _, le := range e {
		if le.line > 0 {
			msgs = append(msgs, fmt.Sprintf("line %d: %s", le.line, le.msg))
		} else {
			msgs = append(msgs, le.msg)
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}
