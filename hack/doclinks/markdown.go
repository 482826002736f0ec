package doclinks

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

var (
	atxHeading     = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setextLine     = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	notParagraph   = regexp.MustCompile(`^\s*([-*+>|]|\d+[.)])`)
	fenceOpen      = regexp.MustCompile("^(`{3,}|~{3,})(.*)$")
	inlineLink     = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^<>\n]*>|[^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*)(?:\s+(?:"[^"]*"|'[^']*'|\([^()]*\)))?\s*\)`)
	referenceDef   = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*(<[^<>\n]*>|\S+)`)
	htmlAnchor     = regexp.MustCompile(`<a\s+(?:[^>]*\s)?(?:name|id)="([^"]+)"`)
	linkInHeading  = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag        = regexp.MustCompile(`<[^>]+>`)
	commandSep     = regexp.MustCompile("&&|\\|\\||[;|()`]")
	makeAssignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*[:+?!]?=`)
)

// Parse reads Markdown: its relative and absolute links, the targets of
// the `make` commands in its code, and the anchors of its headings.
func Parse(md string) *doc {
	p := &parser{d: &doc{Anchors: map[string]bool{}}, seen: map[string]int{}}
	var fence string
	for i, line := range strings.Split(md, "\n") {
		n := i + 1
		trimmed := strings.TrimLeft(line, " \t")
		switch {
		case fence != "":
			if closes(trimmed, fence) {
				fence = ""
			} else {
				p.d.Makes = append(p.d.Makes, makesIn(line, n)...)
			}
		case opens(trimmed) != "":
			p.flush()
			fence = opens(trimmed)
		case strings.TrimSpace(line) == "":
			p.flush()
		case atxHeading.MatchString(line):
			p.flush()
			text := atxHeading.FindStringSubmatch(line)[2]
			p.anchor(text)
			p.inline(text, n)
		case setextLine.MatchString(line) && len(p.para) > 0 && !notParagraph.MatchString(p.para[0]):
			p.anchor(strings.Join(p.para, " "))
			p.flush()
		default:
			if len(p.para) == 0 {
				p.start = n
			}
			p.para = append(p.para, line)
		}
	}
	p.flush()
	return p.d
}

type parser struct {
	d     *doc
	seen  map[string]int // how many headings had each slug
	para  []string       // the paragraph being read
	start int            // its first line
}

func (p *parser) flush() {
	if len(p.para) > 0 {
		p.inline(strings.Join(p.para, "\n"), p.start)
	}
	p.para = nil
}

// anchor adds a heading's anchor as GitHub makes it: its slug, and for the
// n-th repeat of a slug the slug and "-n".
func (p *parser) anchor(heading string) {
	slug := Slug(heading)
	a := slug
	if n := p.seen[slug]; n > 0 {
		a = fmt.Sprintf("%s-%d", slug, n)
	}
	p.seen[slug]++
	p.d.Anchors[a] = true
}

// inline reads text, a paragraph or a heading starting at line start: the
// make commands of its code spans, then, outside them, its links and HTML
// anchors.
func (p *parser) inline(text string, start int) {
	lineAt := func(off int) int { return start + strings.Count(text[:off], "\n") }
	masked := []byte(text)
	for _, span := range codeSpans(text) {
		content := strings.ReplaceAll(text[span[1]:span[2]], "\n", " ")
		p.d.Makes = append(p.d.Makes, makesIn(content, lineAt(span[0]))...)
		for i := span[0]; i < span[3]; i++ {
			if masked[i] != '\n' {
				masked[i] = ' '
			}
		}
	}
	for _, m := range inlineLink.FindAllSubmatchIndex(masked, -1) {
		p.link(string(masked[m[4]:m[5]]), lineAt(m[0]))
	}
	for _, m := range referenceDef.FindAllSubmatchIndex(masked, -1) {
		p.link(string(masked[m[2]:m[3]]), lineAt(m[0]))
	}
	for _, m := range htmlAnchor.FindAllSubmatch(masked, -1) {
		p.d.Anchors[string(m[1])] = true
	}
}

func (p *parser) link(target string, line int) {
	target = strings.TrimSuffix(strings.TrimPrefix(target, "<"), ">")
	if target != "" {
		p.d.Links = append(p.d.Links, Ref{Target: target, Line: line})
	}
}

// opens is the fence that line opens a code block with, or "": a run of
// three or more backticks or tildes, and an info string (without
// backticks after backticks).
func opens(line string) string {
	m := fenceOpen.FindStringSubmatch(line)
	if m == nil || (m[1][0] == '`' && strings.Contains(m[2], "`")) {
		return ""
	}
	return m[1]
}

// closes is true when line closes a block that fence opened: a run of the
// same character at least as long, and nothing after it.
func closes(line, fence string) bool {
	run := strings.TrimRight(line, " \t")
	return len(run) >= len(fence) && strings.Trim(run, fence[:1]) == ""
}

// codeSpans finds the code spans of text: for each, the offsets of its
// opening backticks, its content's start and end, and its end.
func codeSpans(text string) [][4]int {
	var out [][4]int
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		open := backticks(text, i)
		end := -1
		for k := open; k < len(text); {
			if text[k] != '`' {
				k++
				continue
			}
			if closing := backticks(text, k); closing-k == open-i {
				end = k
				break
			} else {
				k = closing
			}
		}
		if end < 0 {
			i = open // a literal run of backticks
			continue
		}
		out = append(out, [4]int{i, open, end, end + open - i})
		i = end + open - i
	}
	return out
}

// backticks returns the end of the run of backticks at text[i].
func backticks(text string, i int) int {
	for i < len(text) && text[i] == '`' {
		i++
	}
	return i
}

// Slug is GitHub's anchor of a heading: its text as rendered (links by
// their text, no HTML tags), in lower case, without punctuation other than
// hyphens and underscores, each space a hyphen.
func Slug(heading string) string {
	s := linkInHeading.ReplaceAllString(heading, "$1")
	s = htmlTag.ReplaceAllString(s, "")
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// makesIn finds the make commands in code (a line of a code block, or a
// code span) and returns the target each names.
func makesIn(code string, line int) []Ref {
	if c := comment(code); c >= 0 {
		code = code[:c]
	}
	var out []Ref
	for _, cmd := range commandSep.Split(code, -1) {
		if t, ok := makeTarget(strings.Fields(cmd)); ok {
			out = append(out, Ref{Target: t, Line: line})
		}
	}
	return out
}

// comment is where a shell comment starts in code: a # that starts a
// word; -1 if none does.
func comment(code string) int {
	for i, r := range code {
		if r == '#' && (i == 0 || code[i-1] == ' ' || code[i-1] == '\t') {
			return i
		}
	}
	return -1
}

// makeTarget is the target a command's words ask make for: the first word
// after `make` that is neither an option nor a variable assignment. A
// command that is not make, names no target, or runs another Makefile
// (-C, -f) names none; neither does a placeholder such as <target>.
func makeTarget(words []string) (string, bool) {
	i := 0
	for i < len(words) && precommand(words[i]) {
		i++
	}
	if i >= len(words) || words[i] != "make" {
		return "", false
	}
	for i++; i < len(words); i++ {
		w := words[i]
		switch {
		case otherMakefile(w):
			return "", false
		case optionWithArgument(w):
			i++
		case (w == "-j" || w == "-l" || w == "--jobs" || w == "--load-average") && i+1 < len(words) && numeric(words[i+1]):
			i++
		case strings.HasPrefix(w, "-") || makeAssignment.MatchString(w):
		default:
			w = strings.TrimRight(w, `.,:'"`)
			if w == "" || strings.ContainsAny(w, "<>$*{}[]") {
				return "", false
			}
			return w, true
		}
	}
	return "", false
}

// precommand is true of a word that may come before a command: a prompt,
// a command that runs the next, or an environment variable's assignment.
func precommand(w string) bool {
	switch w {
	case "$", "sudo", "env", "time", "exec":
		return true
	}
	return makeAssignment.MatchString(w)
}

// otherMakefile is true of an option that makes make read another
// Makefile than the repository's.
func otherMakefile(w string) bool {
	if strings.HasPrefix(w, "--") {
		return strings.HasPrefix(w, "--directory") || strings.HasPrefix(w, "--file") || strings.HasPrefix(w, "--makefile")
	}
	return strings.HasPrefix(w, "-C") || strings.HasPrefix(w, "-f")
}

func optionWithArgument(w string) bool {
	switch w {
	case "-I", "-o", "-W", "--include-dir", "--old-file", "--assume-old", "--new-file", "--assume-new", "--what-if":
		return true
	}
	return false
}

func numeric(w string) bool {
	return w != "" && strings.Trim(w, "0123456789.") == ""
}

// MakeTargets lists the targets a Makefile's rules name: every target of
// every rule line (several to a line too) and every name its .PHONY rules
// list; not special targets (.PHONY, .DEFAULT_GOAL, ...) nor patterns.
func MakeTargets(makefile string) map[string]bool {
	out := map[string]bool{}
	inDefine := false
	for _, line := range strings.Split(strings.ReplaceAll(makefile, "\\\n", " "), "\n") {
		if strings.HasPrefix(line, "\t") {
			continue // a recipe
		}
		trimmed := strings.TrimSpace(line)
		if inDefine {
			inDefine = !strings.HasPrefix(trimmed, "endef")
			continue
		}
		if trimmed == "define" || strings.HasPrefix(trimmed, "define ") {
			inDefine = true
			continue
		}
		if c := strings.Index(line, "#"); c >= 0 {
			line = line[:c]
		}
		before, after, ok := strings.Cut(line, ":")
		if !ok || strings.Contains(before, "=") {
			continue // no rule, or an assignment whose value holds a colon
		}
		if after = strings.TrimPrefix(after, ":"); strings.HasPrefix(after, "=") {
			continue // := or ::=
		}
		names := strings.Fields(before)
		if len(names) == 1 && names[0] == ".PHONY" {
			for _, n := range strings.Fields(after) {
				out[n] = true
			}
			continue
		}
		for _, n := range names {
			if !strings.HasPrefix(n, ".") && !strings.ContainsAny(n, "%$") {
				out[n] = true
			}
		}
	}
	return out
}
