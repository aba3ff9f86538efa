#!/bin/bash
# Alternates scripts/throughput.sh between two builds, N pairs (default 3), and
# prints each run's tasks/s and CPU per task, then the median of each side and of the
# per-pair ratios. On a shared 2-core machine whose speed drifts by a third within
# minutes, only runs made back to back compare; the ratio of each pair is the figure.
#
#   scripts/throughput-pairs.sh /tmp/agentq-before bin/agentq [N]
#
# AGENTQ_LOADGEN names the load generator as for throughput.sh; without it, bin/loadgen is
# built once here, so that every run uses the same one.
set -u
A=$1; B=$2; N=${3:-3}
here=$(dirname "$0")
if [ -z "${AGENTQ_LOADGEN:-}" ]; then
  make -s -C "$here/.." loadgen >&2 || exit 1
  AGENTQ_LOADGEN=$(cd "$here/.." && pwd)/bin/loadgen; export AGENTQ_LOADGEN
fi
run() { "$here/throughput.sh" "$1" 2>/dev/null | head -2 | python3 -c '
import sys, json
l = sys.stdin.read().splitlines()
print(round(json.loads(l[0])["tasks_per_s"]), l[1].replace("cpu s/1000 tasks: ", ""))'; }
ra=(); rb=()
for i in $(seq "$N"); do
  a=$(run "$A"); b=$(run "$B")
  echo "pair $i: A $a | B $b"
  ra+=("${a%% *}"); rb+=("${b%% *}")
done
python3 - "${ra[*]}" "${rb[*]}" <<'PY'
import sys, statistics as st
a = [float(x) for x in sys.argv[1].split()]; b = [float(x) for x in sys.argv[2].split()]
print("median A %.0f  B %.0f tasks/s; median B/A per pair %.2f" % (st.median(a), st.median(b), st.median([y / x for x, y in zip(a, b)])))
PY
