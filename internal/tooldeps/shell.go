package tooldeps

import (
	"strings"
)

// ScanShell returns the programs a shell script runs: the literal command words of its simple
// commands, including those inside command substitutions, and the commands that wrappers run
// (ip netns exec NS CMD, setsid CMD, exec CMD, command -v CMD, sh -c 'SCRIPT', ...). Builtins,
// keywords, the script's own functions and words that are not literal ("$BIN/cablectl") are not
// programs. It is a scanner for the scripts of this repository, not a full shell parser: it
// reads quotes, substitutions, here-documents, comments and case patterns.
func ScanShell(src string) []Found {
	s := &shLexer{src: src, line: 1, funcs: map[string]bool{}}
	s.commands(0)
	var out []Found
	for _, f := range s.found {
		if !s.funcs[f.Program] {
			out = append(out, f)
		}
	}
	return out
}

// Found is a program found in one file, with its line.
type Found struct {
	Program string
	Line    int
}

type shWord struct {
	text    string
	literal bool // no expansion in it: text is what the shell runs
	line    int
}

type shLexer struct {
	src         string
	pos         int
	line        int
	found       []Found
	funcs       map[string]bool
	heredocs    []string // delimiters of here-documents whose bodies start at the next newline
	casePattern bool     // the next words up to ')' are a case pattern
}

func (s *shLexer) peek(off int) byte {
	if s.pos+off < len(s.src) {
		return s.src[s.pos+off]
	}
	return 0
}

// commands reads commands up to the stop byte (')' of $(...), '`', or 0 for the end).
func (s *shLexer) commands(stop byte) {
	var words []shWord
	flush := func() {
		s.command(words)
		words = nil
	}
	for s.pos < len(s.src) {
		c := s.src[s.pos]
		switch {
		case c == ' ' || c == '\t':
			s.pos++
		case c == '\\' && s.peek(1) == '\n':
			s.pos += 2
			s.line++
		case c == stop && stop != 0:
			s.pos++
			flush()
			return
		case c == '#':
			for s.pos < len(s.src) && s.src[s.pos] != '\n' {
				s.pos++
			}
		case c == '\n':
			s.pos++
			s.line++
			flush()
			s.skipHeredocs()
		case c == ';' && s.peek(1) == ';':
			s.pos += 2
			flush()
			s.casePattern = true
		case c == '(' && s.peek(1) == '(':
			// ((...)) and for ((...)) are arithmetic: their words are no commands.
			flush()
			s.skipParens()
		case c == ';' || c == '&' || c == '|' || c == '(' || c == ')':
			s.pos++
			if c == ')' && s.casePattern {
				words = nil
				s.casePattern = false
				continue
			}
			flush()
		case c == '<' || c == '>':
			s.redirection()
		default:
			w := s.word()
			// NAME=(...) is an array: its words are data.
			if strings.HasSuffix(w.text, "=") && isAssignment(w.text) && s.peek(0) == '(' {
				s.skipParens()
				continue
			}
			if len(words) == 0 && w.literal && s.funcDef() {
				s.funcs[w.text] = true
				continue
			}
			if s.casePattern && len(words) == 0 && w.text == "esac" {
				s.casePattern = false
			}
			// A number right before a redirection is its file descriptor.
			if (s.peek(0) == '>' || s.peek(0) == '<') && isDigits(w.text) {
				continue
			}
			words = append(words, w)
			// "case WORD in" needs no separator before its first pattern.
			if len(words) == 3 && words[0].literal && words[0].text == "case" && w.text == "in" {
				flush()
			}
		}
	}
	flush()
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// skipParens skips a parenthesised list (an array's words), counting newlines.
func (s *shLexer) skipParens() {
	depth := 0
	for s.pos < len(s.src) {
		switch s.src[s.pos] {
		case '(':
			depth++
		case ')':
			depth--
		case '\n':
			s.line++
		}
		s.pos++
		if depth == 0 {
			return
		}
	}
}

// funcDef consumes "()" after a word: the word names a function.
func (s *shLexer) funcDef() bool {
	i := s.pos
	for i < len(s.src) && (s.src[i] == ' ' || s.src[i] == '\t') {
		i++
	}
	if strings.HasPrefix(s.src[i:], "()") {
		s.pos = i + 2
		return true
	}
	return false
}

// redirection consumes an operator (<, >, >>, <<, <<<, >&, <&, &>) and its target word; a <<
// registers a here-document.
func (s *shLexer) redirection() {
	start := s.pos
	for s.pos < len(s.src) && strings.IndexByte("<>&|-", s.src[s.pos]) >= 0 {
		s.pos++
	}
	op := s.src[start:s.pos]
	for s.peek(0) == ' ' || s.peek(0) == '\t' {
		s.pos++
	}
	target := s.word()
	if strings.HasPrefix(op, "<<") && !strings.HasPrefix(op, "<<<") {
		s.heredocs = append(s.heredocs, strings.Trim(target.text, `'"`))
	}
}

// skipHeredocs skips the bodies of the pending here-documents: their lines are data.
func (s *shLexer) skipHeredocs() {
	for _, delim := range s.heredocs {
		for s.pos < len(s.src) {
			end := strings.IndexByte(s.src[s.pos:], '\n')
			if end < 0 {
				end = len(s.src) - s.pos
			}
			line := s.src[s.pos : s.pos+end]
			s.pos += end + 1
			s.line++
			if strings.TrimLeft(line, "\t") == delim {
				break
			}
		}
	}
	s.heredocs = nil
}

// word reads one word, scanning the command substitutions inside it.
func (s *shLexer) word() shWord {
	w := shWord{literal: true, line: s.line}
	var b strings.Builder
	for s.pos < len(s.src) {
		c := s.src[s.pos]
		switch {
		case strings.IndexByte(" \t\n;&|()<>", c) >= 0:
			w.text = b.String()
			return w
		case c == '\\':
			if s.peek(1) == '\n' {
				s.pos += 2
				s.line++
				continue
			}
			b.WriteByte(s.peek(1))
			s.pos += 2
		case c == '\'':
			end := strings.IndexByte(s.src[s.pos+1:], '\'')
			if end < 0 {
				end = len(s.src) - s.pos - 1
			}
			body := s.src[s.pos+1 : s.pos+1+end]
			s.line += strings.Count(body, "\n")
			b.WriteString(body)
			s.pos += end + 2
		case c == '"':
			s.pos++
			if !s.doubleQuoted(&b) {
				w.literal = false
			}
		case c == '$':
			s.dollar()
			w.literal = false
		case c == '`':
			s.pos++
			s.commands('`')
			w.literal = false
		default:
			b.WriteByte(c)
			s.pos++
		}
	}
	w.text = b.String()
	return w
}

// doubleQuoted reads up to the closing quote; false when something in it expands.
func (s *shLexer) doubleQuoted(b *strings.Builder) bool {
	literal := true
	for s.pos < len(s.src) {
		c := s.src[s.pos]
		switch c {
		case '"':
			s.pos++
			return literal
		case '\\':
			b.WriteByte(s.peek(1))
			s.pos += 2
		case '$':
			s.dollar()
			literal = false
		case '`':
			s.pos++
			s.commands('`')
			literal = false
		default:
			if c == '\n' {
				s.line++
			}
			b.WriteByte(c)
			s.pos++
		}
	}
	return literal
}

// dollar consumes an expansion: $(...) is scanned for commands, $((...)), ${...} and $NAME skipped.
func (s *shLexer) dollar() {
	s.pos++
	switch {
	case strings.HasPrefix(s.src[s.pos:], "(("):
		depth := 0
		for s.pos < len(s.src) {
			switch s.src[s.pos] {
			case '(':
				depth++
			case ')':
				depth--
			}
			s.pos++
			if depth == 0 {
				return
			}
		}
	case s.peek(0) == '(':
		s.pos++
		saved := s.casePattern
		s.casePattern = false
		s.commands(')')
		s.casePattern = saved
	case s.peek(0) == '{':
		end := strings.IndexByte(s.src[s.pos:], '}')
		if end < 0 {
			end = len(s.src) - s.pos - 1
		}
		s.pos += end + 1
	default:
		for s.pos < len(s.src) {
			c := s.src[s.pos]
			if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
				s.pos++
				continue
			}
			if strings.IndexByte("@*#?$!-", c) >= 0 && s.src[s.pos-1] == '$' {
				s.pos++
			}
			return
		}
	}
}

// shKeywords start or continue compound commands: the word after them is a command.
var shKeywords = map[string]bool{
	"if": true, "then": true, "else": true, "elif": true, "fi": true, "do": true, "done": true,
	"while": true, "until": true, "!": true, "{": true, "}": true, "esac": true,
}

// shBuiltins are bash builtins: they run no program.
var shBuiltins = map[string]bool{
	".": true, ":": true, "[": true, "[[": true, "alias": true, "break": true, "builtin": true,
	"cd": true, "continue": true, "declare": true, "echo": true, "eval": true, "exit": true,
	"export": true, "false": true, "getopts": true, "hash": true, "kill": true, "let": true,
	"local": true, "mapfile": true, "printf": true, "pwd": true, "read": true, "readarray": true,
	"readonly": true, "return": true, "set": true, "shift": true, "shopt": true, "source": true,
	"test": true, "trap": true, "true": true, "type": true, "typeset": true, "ulimit": true,
	"umask": true, "unset": true, "wait": true,
}

// command records the program of one simple command, and those its wrappers run.
func (s *shLexer) command(words []shWord) {
	if s.casePattern {
		return
	}
	for len(words) > 0 {
		w := words[0]
		switch {
		case w.literal && (shKeywords[w.text] || w.text == "time"):
			words = words[1:]
			continue
		case w.literal && (w.text == "for" || w.text == "case" || w.text == "select"):
			if w.text == "case" {
				s.casePattern = true
			}
			return
		case isAssignment(w.text):
			words = words[1:]
			continue
		}
		break
	}
	s.run(words)
}

// run records words[0] as a program, then follows the wrappers that run another command.
func (s *shLexer) run(words []shWord) {
	if len(words) == 0 || !words[0].literal {
		return
	}
	name := words[0].text
	args := words[1:]
	switch name {
	case "exec", "setsid", "nohup", "sudo", "xargs", "nice", "env", "command", "time":
		// Their options, and env's assignments, come before the command.
		for len(args) > 0 && (strings.HasPrefix(args[0].text, "-") && args[0].text != "-v" || isAssignment(args[0].text)) {
			args = args[1:]
		}
		if name == "nice" && len(args) > 0 && isDigits(args[0].text) { // nice -n N: N follows -n
			args = args[1:]
		}
		if name == "command" && len(args) > 0 && args[0].text == "-v" {
			args = args[1:]
		}
		if !shBuiltins[name] && name != "exec" && name != "command" && name != "time" {
			s.record(name, words[0].line)
		}
		s.run(args)
		return
	case "timeout":
		s.record(name, words[0].line)
		for len(args) > 0 && strings.HasPrefix(args[0].text, "-") {
			args = args[1:]
		}
		if len(args) > 0 {
			s.run(args[1:])
		}
		return
	}
	if shBuiltins[name] {
		return
	}
	s.record(name, words[0].line)
	switch {
	case name == "ip" && len(args) >= 3 && args[0].text == "netns" && args[1].text == "exec":
		s.run(args[3:])
	case (name == "sh" || name == "bash" || strings.HasSuffix(name, "/sh") || strings.HasSuffix(name, "/bash")) &&
		len(args) >= 2 && args[0].text == "-c" && args[1].literal:
		for _, f := range ScanShell(args[1].text) {
			s.record(f.Program, words[0].line+f.Line-1)
		}
	}
}

func (s *shLexer) record(name string, line int) {
	// Relative paths are the repository's own scripts and binaries (./bin/x, scripts/y.sh).
	if !validName(name) || strings.Contains(name, "/") && !strings.HasPrefix(name, "/") {
		return
	}
	s.found = append(s.found, Found{Program: name, Line: line})
}

func isAssignment(w string) bool {
	eq := strings.IndexByte(w, '=')
	if eq <= 0 {
		return false
	}
	name := strings.TrimSuffix(w[:eq], "+")
	for i, c := range name {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
