// Package mcs holds the rules of multi-cluster services, after the Kubernetes MCS API
// (sigs.k8s.io/mcs-api, KEP-1645): what a valid ServiceExport is and its defaults, how the
// exports of one namespace/name merge into one ServiceImport (ports are the union; a conflicting
// type or port makes the oldest export win and the others get a Conflict), how clusterset VIPs
// are allocated, and which imports an agent may see (from its own cluster and the clusters its
// connection policies connect it to, admitted by its import selector).
//
// It is pure: no I/O. The broker applies Merge and AllocateVIP inside its store transactions;
// the agent maps imports to DNS records and eBPF backends.
package mcs
