#!/usr/bin/env bash
# Lays down Cablemesh on a Universal host (`make install`): the binaries, the systemd units
# (deploy/systemd) and a config skeleton in /etc/cablemesh that never replaces an existing one.
# Everything goes under $DESTDIR when it is set (packaging, tests).
#   scripts/install.sh BIN_DIR
# Environment: DESTDIR (default empty), PREFIX (default /usr/local; the units run
# /usr/local/bin/*, so change it only together with them), SYSTEMD_UNIT_DIR (default
# /etc/systemd/system), CONFIG_DIR (default /etc/cablemesh).
set -euo pipefail

bin=${1:?usage: scripts/install.sh BIN_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
destdir=${DESTDIR:-}
prefix=${PREFIX:-/usr/local}
unitdir=${SYSTEMD_UNIT_DIR:-/etc/systemd/system}
confdir=${CONFIG_DIR:-/etc/cablemesh}

for b in cable-agent cable-broker cablectl; do
	[[ -x $bin/$b ]] || { echo "install: $bin/$b is missing; run make build first" >&2; exit 1; }
	install -D -m 0755 "$bin/$b" "$destdir$prefix/bin/$b"
	echo "installed $destdir$prefix/bin/$b"
done
for u in "$root"/deploy/systemd/*.service; do
	install -D -m 0644 "$u" "$destdir$unitdir/$(basename "$u")"
	echo "installed $destdir$unitdir/$(basename "$u")"
done
# The config holds the operator's values: an existing file is never touched.
install -d -m 0755 "$destdir$confdir" "$destdir$confdir/policies"
if [[ -e $destdir$confdir/agent.yaml ]]; then
	echo "kept existing $destdir$confdir/agent.yaml"
else
	install -m 0600 "$root/deploy/systemd/agent.yaml" "$destdir$confdir/agent.yaml"
	echo "installed $destdir$confdir/agent.yaml (a skeleton: fill in its upper-case values)"
fi
if [[ -z $destdir ]] && command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
	systemctl daemon-reload
fi
echo "next: edit $confdir/agent.yaml, then systemctl enable --now cable-agent (and cable-broker on the broker host)"
