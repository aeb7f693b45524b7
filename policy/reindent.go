package policy

import (
	"fmt"
	"regexp"
	"strings"
)

// priorityLine is the one line reindentPriority moves: "priority: N", N an
// integer, with an optional trailing comment.
var priorityLine = regexp.MustCompile(`^priority:[ ]+-?[0-9]+[ ]*(?:#.*)?$`)

// specLine opens the block of a document's spec.
var specLine = regexp.MustCompile(`^spec:[ ]*(?:#.*)?$`)

// reindentPriority repairs the one known defect of the examples of Submariner's connectivity proposal and
// nothing else: a `priority: N` line of a document's top-level spec block that
// sits deeper than spec's other entries and at no indentation open there, as
// in
//
//	spec:
//	  cableDriver:
//	      name:  "some-driver"
//	   priority: 3
//
// It returns the text with each such line moved to the column of spec's
// entries, and one message per moved line. Any other indentation problem in a
// spec block (another key, a tab, a priority shallower than spec's entries or
// inside a nested block) means no repair at all: the caller then reports the
// YAML parser's error. It is tried only after the YAML failed to parse, and
// the result is parsed and strictly decoded again.
func reindentPriority(data []byte) ([]byte, []string) {
	lines := strings.Split(string(data), "\n")
	var moved []string
	for i := 0; i < len(lines); i++ {
		if !specLine.MatchString(strings.TrimSuffix(lines[i], "\r")) {
			continue
		}
		end := i + 1
		for end < len(lines) && !endsBlock(lines[end]) {
			end++
		}
		msgs, ok := reindentSpec(lines, i+1, end)
		if !ok {
			return data, nil
		}
		moved = append(moved, msgs...)
		i = end - 1
	}
	if len(moved) == 0 {
		return data, nil
	}
	return []byte(strings.Join(lines, "\n")), moved
}

// endsBlock reports a line at column 1 that is not a comment: the next
// top-level key or a document marker ends a spec block.
func endsBlock(line string) bool {
	line = strings.TrimSuffix(line, "\r")
	return line != "" && line[0] != ' ' && line[0] != '\t' && line[0] != '#'
}

// reindentSpec moves the mis-indented priority lines of the spec block
// lines[from:to] in place. ok is false if the block is mis-indented in any
// other way.
func reindentSpec(lines []string, from, to int) (moved []string, ok bool) {
	var (
		open     []int // indentation of the open blocks, spec's entries first
		opens    bool  // the previous entry opened a nested block
		scalarAt = -1  // indentation of the entry whose block scalar we are in
	)
	for i := from; i < to; i++ {
		line := strings.TrimSuffix(lines[i], "\r") // a CRLF file keeps its line ends
		trimmed := strings.TrimLeft(line, " \t")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		ind := len(line) - len(trimmed)
		if strings.Contains(line[:ind], "\t") {
			return nil, false // YAML does not indent with tabs
		}
		if scalarAt >= 0 {
			if ind > scalarAt {
				continue
			}
			scalarAt = -1
		}
		switch {
		case len(open) == 0 && (trimmed == "-" || strings.HasPrefix(trimmed, "- ")):
			return nil, false // spec is a list, which no repair makes a policy
		case len(open) == 0 || opens && ind > open[len(open)-1]:
			open = append(open, ind)
		default:
			for len(open) > 1 && open[len(open)-1] > ind {
				open = open[:len(open)-1]
			}
			if top := open[len(open)-1]; top != ind {
				// Mis-indented. Repaired only when it is the proposal's case.
				if len(open) != 1 || ind < top || !priorityLine.MatchString(trimmed) {
					return nil, false
				}
				lines[i] = strings.Repeat(" ", top) + strings.TrimLeft(lines[i], " ")
				moved = append(moved, fmt.Sprintf("line %d: moved %q from column %d to column %d, the indentation of its siblings (the YAML was mis-indented)",
					i+1, strings.TrimSpace(trimmed), ind+1, top+1))
				ind = top
			}
		}
		// "- key: v" opens a mapping whose entries sit after the dash.
		rest := trimmed
		for strings.HasPrefix(rest, "- ") {
			after := strings.TrimLeft(rest[1:], " ")
			ind += len(rest) - len(after)
			open = append(open, ind)
			rest = after
		}
		value := strings.TrimSpace(stripComment(rest))
		opens = opensBlock.MatchString(value)
		if blockScalar.MatchString(value) {
			scalarAt, opens = ind, false
		}
	}
	return moved, true
}

var (
	// opensBlock matches an entry whose value is on the next lines ("key:",
	// "key: &anchor", "-").
	opensBlock = regexp.MustCompile(`(?:^|:)(?:[ ]+[&!][^ ]*)*$|^-$`)
	// blockScalar matches an entry whose value is a literal or folded block
	// scalar.
	blockScalar = regexp.MustCompile(`(?:^|:[ ]+)[|>][-+0-9]*$`)
)

// stripComment drops a trailing " # comment" outside quotes.
func stripComment(s string) string {
	inSingle, inDouble := false, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\'':
			if !inDouble {
				inSingle = !inSingle
			}
		case '"':
			if !inSingle {
				inDouble = !inDouble
			}
		case '#':
			if !inSingle && !inDouble && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t') {
				return s[:i]
			}
		}
	}
	return s
}
