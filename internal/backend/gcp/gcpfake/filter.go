package gcpfake

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// The list filter grammar the Compute API documents for list and
// aggregatedList: either one regular-expression comparison (field eq|ne
// value, RE2, whole-value match), or AIP-160 comparisons (field = value,
// !=, <, <=, >, >=, and : for presence), combined with AND, OR and
// juxtaposition. More than one comparison must each be in parentheses: the
// API rejects `a = "x" AND b = "y"`, which is why the backend writes
// `(a = "x") AND (b = "y")`. The fake rejects what it cannot parse, as
// the API does, instead of guessing.

// filterExpr is a parsed filter: a comparison, or a group joined by AND
// (juxtaposition included) or OR.
type filterExpr struct {
	// A comparison.
	field, op, value string
	// A group: every term (and) or any term (or).
	or     bool
	terms  []*filterExpr
	parens bool
	not    bool
}

type filterParser struct {
	in  string
	pos int
}

func parseFilter(in string) (*filterExpr, error) {
	if strings.TrimSpace(in) == "" {
		return nil, nil
	}
	p := &filterParser{in: in}
	e, err := p.and()
	if err != nil {
		return nil, err
	}
	p.space()
	if p.pos != len(p.in) {
		return nil, errors.Errorf("unexpected %q at offset %d", p.in[p.pos:], p.pos)
	}
	// Several comparisons must each be parenthesized.
	if len(e.terms) > 1 || (e.or && len(e.terms) > 0) {
		if err := checkParenthesized(e); err != nil {
			return nil, err
		}
	}
	if err := checkStyles(e); err != nil {
		return nil, err
	}
	return e, nil
}

func checkParenthesized(e *filterExpr) error {
	for _, t := range e.terms {
		if t.terms == nil && !t.parens {
			return errors.Errorf("the expression %s %s %s must be in parentheses: a filter of several expressions puts each in parentheses", t.field, t.op, t.value)
		}
		if t.terms != nil && !t.parens {
			if err := checkParenthesized(t); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStyles refuses a filter mixing regular-expression and AIP-160
// comparisons.
func checkStyles(e *filterExpr) error {
	regex, aip := false, false
	var walk func(*filterExpr)
	walk = func(e *filterExpr) {
		if e.terms == nil {
			if e.op == "eq" || e.op == "ne" {
				regex = true
			} else {
				aip = true
			}
		}
		for _, t := range e.terms {
			walk(t)
		}
	}
	walk(e)
	if regex && aip {
		return errors.Errorf("a filter cannot mix eq and ne with the operators =, !=, <, >, <=, >= and colon")
	}
	return nil
}

func (p *filterParser) space() {
	for p.pos < len(p.in) && unicode.IsSpace(rune(p.in[p.pos])) {
		p.pos++
	}
}

func (p *filterParser) keyword(k string) bool {
	p.space()
	if strings.HasPrefix(p.in[p.pos:], k) {
		end := p.pos + len(k)
		if end == len(p.in) || unicode.IsSpace(rune(p.in[end])) || p.in[end] == '(' {
			p.pos = end
			return true
		}
	}
	return false
}

// and parses terms joined by AND or juxtaposition; OR binds tighter, as in
// AIP-160.
func (p *filterParser) and() (*filterExpr, error) {
	g := &filterExpr{}
	for {
		t, err := p.or()
		if err != nil {
			return nil, err
		}
		g.terms = append(g.terms, t)
		p.space()
		if p.pos == len(p.in) || p.in[p.pos] == ')' {
			break
		}
		p.keyword("AND")
	}
	if len(g.terms) == 1 {
		return g.terms[0], nil
	}
	return g, nil
}

func (p *filterParser) or() (*filterExpr, error) {
	t, err := p.term()
	if err != nil {
		return nil, err
	}
	g := &filterExpr{or: true, terms: []*filterExpr{t}}
	for p.keyword("OR") {
		t, err := p.term()
		if err != nil {
			return nil, err
		}
		g.terms = append(g.terms, t)
	}
	if len(g.terms) == 1 {
		return t, nil
	}
	return g, nil
}

var (
	reFilterField = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_]*(\.[a-zA-Z0-9_-]+)*`)
	reFilterOp    = regexp.MustCompile(`^(<=|>=|!=|=|<|>|:|eq\s|ne\s)`)
)

func (p *filterParser) term() (*filterExpr, error) {
	p.space()
	not := p.keyword("NOT")
	p.space()
	if p.pos < len(p.in) && p.in[p.pos] == '(' {
		p.pos++
		e, err := p.and()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.pos >= len(p.in) || p.in[p.pos] != ')' {
			return nil, errors.Errorf("missing ) at offset %d", p.pos)
		}
		p.pos++
		e.parens, e.not = true, not
		return e, nil
	}
	field := reFilterField.FindString(p.in[p.pos:])
	if field == "" {
		return nil, errors.Errorf("expected a field name at offset %d", p.pos)
	}
	p.pos += len(field)
	p.space()
	op := reFilterOp.FindString(p.in[p.pos:])
	if op == "" {
		return nil, errors.Errorf("expected an operator after %s", field)
	}
	p.pos += len(op)
	p.space()
	value, err := p.value()
	if err != nil {
		return nil, err
	}
	return &filterExpr{field: field, op: strings.TrimSpace(op), value: value, not: not}, nil
}

func (p *filterParser) value() (string, error) {
	if p.pos >= len(p.in) {
		return "", errors.Errorf("expected a value at the end")
	}
	if q := p.in[p.pos]; q == '"' || q == '\'' {
		end := strings.IndexByte(p.in[p.pos+1:], q)
		if end < 0 {
			return "", errors.Errorf("unterminated string at offset %d", p.pos)
		}
		v := p.in[p.pos+1 : p.pos+1+end]
		p.pos += end + 2
		return v, nil
	}
	start := p.pos
	for p.pos < len(p.in) && !unicode.IsSpace(rune(p.in[p.pos])) && p.in[p.pos] != ')' && p.in[p.pos] != '(' {
		p.pos++
	}
	if p.pos == start {
		return "", errors.Errorf("expected a value at offset %d", start)
	}
	return p.in[start:p.pos], nil
}

// selects evaluates e on a resource, in the JSON form the API filters.
func (e *filterExpr) selects(m proto.Message) bool {
	if vm, ok := m.(*computepb.Instance); ok && e.onlyOf("name", "status", "labels.") {
		return e.match(instanceFields(vm))
	}
	b, err := protojson.Marshal(m)
	var obj map[string]any
	if err == nil {
		err = json.Unmarshal(b, &obj)
	}
	return err == nil && e.match(obj)
}

// onlyOf reports whether every field e compares is one of fields, or
// starts with one ending in a dot.
func (e *filterExpr) onlyOf(fields ...string) bool {
	if e == nil {
		return true
	}
	if e.terms != nil {
		for _, t := range e.terms {
			if !t.onlyOf(fields...) {
				return false
			}
		}
		return true
	}
	for _, f := range fields {
		if e.field == f || strings.HasSuffix(f, ".") && strings.HasPrefix(e.field, f) {
			return true
		}
	}
	return false
}

// instanceFields is a VM's name, status and labels as its JSON form has
// them (a field not set is absent), without encoding the rest: a listing
// of a project of 10 000 VMs compares the labels of each, and encoding
// each VM to JSON for it made the fake's list the cost of make scale's
// deletes. TestInstanceFieldsAsJSON checks both ways agree.
func instanceFields(vm *computepb.Instance) map[string]any {
	obj := map[string]any{}
	if vm.Name != nil {
		obj["name"] = vm.GetName()
	}
	if vm.Status != nil {
		obj["status"] = vm.GetStatus()
	}
	if len(vm.GetLabels()) > 0 {
		labels := make(map[string]any, len(vm.GetLabels()))
		for k, v := range vm.GetLabels() {
			labels[k] = v
		}
		obj["labels"] = labels
	}
	return obj
}

// match evaluates e on a resource in its JSON form.
func (e *filterExpr) match(obj map[string]any) bool {
	if e == nil {
		return true
	}
	var ok bool
	switch {
	case e.terms != nil && e.or:
		for _, t := range e.terms {
			ok = ok || t.match(obj)
		}
	case e.terms != nil:
		ok = true
		for _, t := range e.terms {
			ok = ok && t.match(obj)
		}
	default:
		ok = e.compare(obj)
	}
	return ok != e.not
}

func (e *filterExpr) compare(obj map[string]any) bool {
	var cur any = obj
	for _, part := range strings.Split(e.field, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			cur = nil
			break
		}
		cur = m[part]
	}
	got, present := fmt.Sprint(cur), cur != nil
	if !present {
		got = ""
	}
	switch e.op {
	case "=":
		return present && got == e.value
	case "!=":
		return got != e.value
	case ":":
		return present && (e.value == "*" || strings.Contains(got, e.value))
	case "eq", "ne":
		re, err := regexp.Compile("^(?:" + e.value + ")$")
		return err == nil && re.MatchString(got) == (e.op == "eq")
	}
	a, errA := strconv.ParseFloat(got, 64)
	b, errB := strconv.ParseFloat(e.value, 64)
	cmp := strings.Compare(got, e.value)
	if errA == nil && errB == nil {
		cmp = map[bool]int{true: -1, false: 1}[a < b]
		if a == b {
			cmp = 0
		}
	}
	return present && map[string]bool{"<": cmp < 0, "<=": cmp <= 0, ">": cmp > 0, ">=": cmp >= 0}[e.op]
}
