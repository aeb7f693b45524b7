package kube

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
)

// validCondition is v as the MCS Valid condition of a ServiceExport of generation gen. Its
// LastTransitionTime is left for meta.SetStatusCondition to set when the status changes.
func validCondition(v Validity, gen int64) metav1.Condition {
	status := metav1.ConditionFalse
	if v.Valid {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{
		Type:               ConditionValid,
		Status:             status,
		Reason:             v.Reason,
		Message:            v.Message,
		ObservedGeneration: gen,
	}
}

// hasCondition reports whether se already carries want (its transition time aside).
func hasCondition(se *mcsv1a1.ServiceExport, want metav1.Condition) bool {
	c := meta.FindStatusCondition(se.Status.Conditions, want.Type)
	return c != nil && c.Status == want.Status && c.Reason == want.Reason && c.Message == want.Message &&
		c.ObservedGeneration == want.ObservedGeneration
}

// withCondition is a copy of se that carries want, its other conditions untouched; the
// transition time moves only when the condition's status does.
func withCondition(se *mcsv1a1.ServiceExport, want metav1.Condition) *mcsv1a1.ServiceExport {
	out := se.DeepCopy()
	meta.SetStatusCondition(&out.Status.Conditions, want)
	return out
}

// hasConditions reports whether se carries every one of want.
func hasConditions(se *mcsv1a1.ServiceExport, want []metav1.Condition) bool {
	for _, c := range want {
		if !hasCondition(se, c) {
			return false
		}
	}
	return true
}

// withConditions is a copy of se that carries every one of want (as withCondition).
func withConditions(se *mcsv1a1.ServiceExport, want []metav1.Condition) *mcsv1a1.ServiceExport {
	out := se.DeepCopy()
	for _, c := range want {
		meta.SetStatusCondition(&out.Status.Conditions, c)
	}
	return out
}
