package deploy

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// nodePlacement turns a label selector into a nodeSelector (its equality requirements) and the
// matchExpressions of a required node affinity (the others).
func nodePlacement(sel string) (map[string]any, []any, error) {
	if len(sel) > maxValueBytes {
		return nil, nil, fmt.Errorf("gateway nodes selector: %d bytes, at most %d", len(sel), maxValueBytes)
	}
	parsed, err := labels.Parse(sel)
	if err != nil {
		return nil, nil, fmt.Errorf("gateway nodes selector %q: %w", sel, err)
	}
	reqs, _ := parsed.Requirements()
	if len(reqs) == 0 {
		return nil, nil, fmt.Errorf("gateway nodes selector %q: selects every node; name the gateway nodes' label (e.g. %s)", sel, DefaultGateways)
	}
	nodeSel := map[string]any{"kubernetes.io/os": "linux"}
	var exprs []any
	for _, r := range reqs {
		vals := r.Values().List()
		var op string
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals:
			nodeSel[r.Key()] = vals[0]
			continue
		case selection.In:
			op = "In"
		case selection.NotEquals, selection.NotIn:
			op = "NotIn"
		case selection.Exists:
			op = "Exists"
		case selection.DoesNotExist:
			op = "DoesNotExist"
		case selection.GreaterThan:
			op = "Gt"
		case selection.LessThan:
			op = "Lt"
		default:
			return nil, nil, fmt.Errorf("gateway nodes selector %q: operator %q has no node affinity equivalent", sel, r.Operator())
		}
		e := map[string]any{"key": r.Key(), "operator": op}
		if len(vals) > 0 {
			anyVals := make([]any, len(vals))
			for i, s := range vals {
				anyVals[i] = s
			}
			e["values"] = anyVals
		}
		exprs = append(exprs, e)
	}
	return nodeSel, exprs, nil
}

// workerPlacement is the required node affinity of the workers: every node the gateway selector
// does not select. A selector is an AND of requirements, so its negation is an OR of the negated
// requirements: one nodeSelectorTerm each (terms are ORed). Node affinity's NotIn and
// DoesNotExist match a node without the label, as the negation of k=v or k in (...) must. Gt and
// Lt have no exact negation (a value that is not an integer matches neither): "not > n" becomes
// "< n+1, or no such label".
func workerPlacement(sel string) ([]any, error) {
	parsed, err := labels.Parse(sel)
	if err != nil {
		return nil, fmt.Errorf("gateway nodes selector %q: %w", sel, err)
	}
	reqs, _ := parsed.Requirements()
	var terms []any
	term := func(key, op string, vals ...string) {
		e := map[string]any{"key": key, "operator": op}
		if len(vals) > 0 {
			anyVals := make([]any, len(vals))
			for i, s := range vals {
				anyVals[i] = s
			}
			e["values"] = anyVals
		}
		terms = append(terms, map[string]any{"matchExpressions": []any{e}})
	}
	for _, r := range reqs {
		vals := r.Values().List()
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
			term(r.Key(), "NotIn", vals...)
		case selection.NotEquals, selection.NotIn:
			term(r.Key(), "In", vals...)
		case selection.Exists:
			term(r.Key(), "DoesNotExist")
		case selection.DoesNotExist:
			term(r.Key(), "Exists")
		case selection.GreaterThan, selection.LessThan:
			n, err := strconv.ParseInt(vals[0], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("gateway nodes selector %q: %s %s: not an integer", sel, r.Operator(), vals[0])
			}
			if r.Operator() == selection.GreaterThan {
				term(r.Key(), "Lt", strconv.FormatInt(n+1, 10))
			} else {
				term(r.Key(), "Gt", strconv.FormatInt(n-1, 10))
			}
			term(r.Key(), "DoesNotExist")
		default:
			return nil, fmt.Errorf("gateway nodes selector %q: operator %q has no node affinity equivalent", sel, r.Operator())
		}
	}
	return terms, nil
}
