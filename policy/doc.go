// Package policy holds ClusterConnectionPolicies (after Submariner's connectivity proposal): the type, its
// label selectors, validation, the YAML decoder and the resolver that decides,
// for every pair of clusters, whether they connect and over which cable.
//
// It is pure: no I/O, nothing of the project imported. The broker validates
// and stores policies with it, the agents resolve their pairs with it, and
// cablectl parses selectors, cable options and files with it; because the
// resolver is a deterministic, symmetric function of (policies, default
// policy, cluster labels), both ends of a pair always reach the same decision.
//
// # Reading the proposal
//
// Submariner's connectivity proposal leaves several points open; these are the choices made here.
//
//   - Kind: ClusterConnectionPolicy and the proposal's ClusterConnectionPolicies
//     are both accepted and stored as ClusterConnectionPolicy. apiVersion may
//     be empty, "v1" (two of the proposal's examples) or APIVersion, and is stored
//     as APIVersion.
//   - Selectors: the proposal writes labels directly under a selector
//     (`location: on-premise`); that shorthand and the Kubernetes
//     {matchLabels, matchExpressions} form are both accepted (a selector with a
//     matchLabels or matchExpressions key is the structured form). A value
//     written `!production` — which YAML parses as a local tag, not a string —
//     or "!production" means "not production": NotIn, which like Kubernetes'
//     NotIn also matches clusters without the label. An empty or null
//     selector matches every cluster. Output is always the structured form.
//   - Topology (DESIGN.md: "the topology decides which pairs inside a matching
//     set connect"), with L and R the clusters matched by the left and right
//     selectors, or L = R = the clusters matched by clusterSelector:
//     point-to-point covers and connects the pairs with one end in L and the
//     other in R, in either order (the proposal's on-prem policy, L = R =
//     on-premise, connects the on-premise clusters with each other); it does
//     not cover pairs inside L or inside R only, which fall to lower
//     priorities or the default. full-mesh covers and connects every pair
//     inside L ∪ R. client-server covers every pair inside L ∪ R, connects
//     those with a server (L) at one end and a client (R) at the other, and
//     decides no-connect for the rest (client with client; server with server
//     unless one of them is also a client) — this is what makes the proposal's
//     "no other clusters connect to one another" true even when the mesh
//     default is to connect. In client-server the client initiates; in every
//     other case, and between two servers that are both clients, the
//     lexically smaller cluster name does. client-server needs the left/right
//     form. An omitted topology is point-to-point in the left/right form and
//     full-mesh otherwise.
//   - A no-connect policy decides no-connect for every pair its topology
//     covers, and may not name a cable driver.
//   - A connect policy without cableDriver uses the mesh default policy's
//     driver and options (DefaultDriver, the registry's, when the default is
//     no-connect). A cableDriver given without a name is an error.
//   - Priority: absent is 0; higher wins. Among covering policies of the top
//     priority, agreeing ones (same verdict, same driver and options) do not
//     conflict; disagreeing ones resolve as DESIGN.md says (no-connect beats
//     connect, then the lexically smallest name) and the losers appear in
//     Decision.Conflicts and in their Status.
//   - The default policy is passed apart from the others and applies only
//     when no other policy covers a pair; a policy in the list with the
//     default's name is the default itself and is skipped there. If the
//     default does not cover a pair either (it has a selector), the pair does
//     not connect. An invalid default connects nothing.
//   - Origin: a policy applied by a cluster (Origin = its name)
//     covers only pairs that include that cluster, and at equal priority a
//     mesh policy outranks it: it votes on a pair only when no mesh policy of
//     its priority covers that pair. Its local name, labels and the synced
//     name <name>-<hash> are in origin.go.
//   - The proposal's two client-server examples indent `priority: 3` at column 4,
//     between spec's children (column 3) and cableDriver's (column 7): not
//     valid YAML. DecodeYAML parses the file as written first; only if that
//     fails, and the only mis-indented lines of its spec blocks are such
//     `priority: N` lines deeper than spec's children, does it move them to
//     spec's column (priority is a spec field, as the proposal's Go type says),
//     parse again, and report each moved line through DecodeYAMLWithWarnings.
//     Any other YAML that does not parse (another mis-indented key, a tab, a
//     priority outside spec) is refused with the parser's error. The
//     repaired text is decoded strictly like any other.
//   - status in an applied file is ignored (the broker writes it); origin is
//     kept but the broker overwrites it.
package policy
