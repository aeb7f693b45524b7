package policy

import (
	"fmt"
	"regexp"
	"strings"
)

// keyLine matches a block mapping entry "key:" or "key: value" (plain or
// quoted key), which is all reindent ever moves.
var keyLine = regexp.MustCompile(`^(?:"[^"]*"|'[^']*'|[^\s#'"\-\[\]{}&*!|>%@` + "`" + `][^:#]*?)\s*:(?:\s|$)`)

// blockScalar matches a value that starts a literal or folded block scalar.
var blockScalar = regexp.MustCompile(`:\s*[|>][-+0-9]*\s*(?:#.*)?$`)

// reindent moves "key: value" lines that sit at an indentation no enclosing
// block uses to the nearest level that is in use (ties go outward), and
// returns the new text and one message per moved line. It is a repair for
// hand-written files such as seed 004's, tried only after the YAML failed to
// parse; the result is parsed and strictly decoded again, so a wrong guess
// still ends in an error rather than a silently different policy.
func reindent(data []byte) ([]byte, []string) {
	lines := strings.Split(string(data), "\n")
	var (
		stack    []int // indentation of the open block entries
		opens    bool  // the previous entry opened a nested block
		scalarAt = -1  // indentation of the key whose block scalar we are in
		moved    []string
	)
	for i, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		ind := len(line) - len(trimmed)
		if scalarAt >= 0 {
			if ind > scalarAt {
				continue
			}
			scalarAt = -1
		}
		if ind == 0 && (strings.HasPrefix(trimmed, "---") || strings.HasPrefix(trimmed, "...")) {
			stack, opens = nil, false
			continue
		}
		popped := -1
		for len(stack) > 0 && stack[len(stack)-1] > ind {
			popped = stack[len(stack)-1]
			stack = stack[:len(stack)-1]
		}
		top := -1
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top < ind {
			switch {
			case opens || top < 0:
				stack = append(stack, ind)
			case keyLine.MatchString(trimmed):
				target := top
				if popped >= 0 && popped-ind < ind-top {
					target = popped
					stack = append(stack, popped)
				}
				lines[i] = strings.Repeat(" ", target) + trimmed
				moved = append(moved, fmt.Sprintf("line %d: moved %q from column %d to column %d, the indentation of its siblings (the YAML was mis-indented)",
					i+1, strings.TrimSpace(trimmed), ind+1, target+1))
				ind = target
			default:
				// A continuation of a multi-line value: leave it alone.
				continue
			}
		}
		// Entries of a block sequence: "- key: v" opens a mapping whose keys
		// sit after the dash.
		rest := trimmed
		for strings.HasPrefix(rest, "- ") || rest == "-" {
			after := strings.TrimLeft(strings.TrimPrefix(rest, "-"), " ")
			inner := ind + (len(rest) - len(after))
			if after == "" {
				break
			}
			stack = append(stack, inner)
			ind, rest = inner, after
		}
		value := strings.TrimSpace(stripComment(rest))
		opens = strings.HasSuffix(value, ":") || value == "-" || strings.HasSuffix(value, " -")
		if blockScalar.MatchString(stripComment(rest)) {
			scalarAt = ind
			opens = false
		}
	}
	if len(moved) == 0 {
		return data, nil
	}
	return []byte(strings.Join(lines, "\n")), moved
}

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
