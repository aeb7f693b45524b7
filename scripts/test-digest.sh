#!/usr/bin/env bash
# test-digest.sh LOG: after a failed `make test`, print what each failed Go test said last before
# the harness's failure dump, so the cause is at the end of a long log (the CI shows its tail).
# A test's own lines are those `go test -v` prints as "    file.go:N: message"; the harness's
# timestamped progress lines and its "---- " dumps (process logs, host state) are left out.
set -euo pipefail
log=${1:?usage: test-digest.sh LOG}
awk '
function top(name) { sub(/\/.*/, "", name); return name }
/^=== (RUN|NAME|CONT|PAUSE) / { cur = top($3); dumping[cur] = 0; next }
/^--- FAIL: / { failed[$3] = 1; if (!(($3) in seen)) { order[++n] = $3; seen[$3] = 1 }; next }
/^panic: / || /^FAIL\t/ || /^make: \*\*\*/ { other[++m] = $0; next }
cur != "" && /^ +[A-Za-z0-9_]+\.go:[0-9]+: ---- / { dumping[cur] = 1; next }
cur != "" && !dumping[cur] && /^ +[A-Za-z0-9_]+\.go:[0-9]+: / {
	if ($0 ~ /\.go:[0-9]+: [0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9]+ /) next
	if ($0 ~ /teardown: deleted namespaces/) next
	k = ++count[cur]; lines[cur, k] = substr($0, 1, 400)
}
END {
	if (n == 0 && m == 0) exit
	print "==== failure digest: the last lines each failed test printed before its dump"
	for (i = 1; i <= n; i++) {
		t = order[i]; if (!failed[t]) continue
		print "--- FAIL: " t
		from = count[t] - 11; if (from < 1) from = 1
		for (k = from; k <= count[t]; k++) print lines[t, k]
	}
	for (i = 1; i <= m; i++) print other[i]
}' "$log"
