package kube

import (
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/mcs"
)

// The MCS Conflict condition on a ServiceExport, and its reasons (sigs.k8s.io/mcs-api v1alpha1).
const (
	ConditionConflict   = string(mcsv1a1.ServiceExportConditionConflict)
	ReasonTypeConflict  = string(mcsv1a1.ServiceExportReasonTypeConflict)
	ReasonPortConflict  = string(mcsv1a1.ServiceExportReasonPortConflict)
	ReasonNoConflicts   = string(mcsv1a1.ServiceExportReasonNoConflicts)
	reasonOtherConflict = "Conflict" // a field the broker names that the MCS API has no reason for
)

// SetConflicts hands the Watcher the broker's latest answer about this cluster's exports: the
// conflicts of its exports in their imports (the SetExports response; the oldest export wins).
// From then on every valid ServiceExport carries the MCS Conflict condition: True with the
// conflict's reason and message when the broker named it, else False (NoConflicts). Before the
// first call the Watcher writes no Conflict condition, since it does not know. A conflict whose
// message names no service (a broker that words them otherwise) is left out. Safe to call from
// any goroutine; it asks for a pass.
func (w *Watcher) SetConflicts(conflicts []statusapi.ServiceConflict) {
	byService := map[string][]statusapi.ServiceConflict{}
	for _, c := range conflicts {
		key, reason, ok := mcs.ConflictService(c.Message)
		if !ok {
			continue
		}
		c.Message = reason
		byService[key] = append(byService[key], c)
	}
	w.conflictsMu.Lock()
	w.conflicts, w.conflictsKnown = byService, true
	w.conflictsMu.Unlock()
	w.poke()
}

// conflictCondition is the Conflict condition of the ServiceExport key of generation gen, and
// false while the broker has not answered yet.
func (w *Watcher) conflictCondition(key string, gen int64) (metav1.Condition, bool) {
	w.conflictsMu.Lock()
	cs, known := w.conflicts[key], w.conflictsKnown
	w.conflictsMu.Unlock()
	if !known {
		return metav1.Condition{}, false
	}
	return conflictCondition(cs, gen), true
}

// conflictCondition is cs as the MCS Conflict condition of a ServiceExport of generation gen.
func conflictCondition(cs []statusapi.ServiceConflict, gen int64) metav1.Condition {
	if len(cs) == 0 {
		return metav1.Condition{Type: ConditionConflict, Status: metav1.ConditionFalse, Reason: ReasonNoConflicts,
			Message: "no conflict with the other clusters' exports", ObservedGeneration: gen}
	}
	var reasons, msgs []string
	for _, c := range cs {
		reasons = append(reasons, conflictReason(c.Field))
		msgs = append(msgs, c.Field+": "+c.Message)
	}
	slices.Sort(reasons)
	reasons = slices.Compact(reasons)
	reason := reasons[0]
	if len(reasons) > 1 {
		reason = reasonOtherConflict
	}
	return metav1.Condition{Type: ConditionConflict, Status: metav1.ConditionTrue, Reason: reason,
		Message: "left out of the import, the oldest export wins: " + strings.Join(msgs, "; "), ObservedGeneration: gen}
}

func conflictReason(field string) string {
	switch field {
	case "type":
		return ReasonTypeConflict
	case "ports":
		return ReasonPortConflict
	}
	return reasonOtherConflict
}
