#!/bin/bash
# Alternates scripts/throughput.sh between two builds, N pairs (default 3), each run on
# a fresh database and Redis db, and prints each run's tasks/s and CPU per task; then,
# for each side, the medians, and the median of the per-pair ratios B/A: tasks/s, the
# CPU per task of agentq, Redis and Postgres together, and the machine's busy time per
# task (every process, the load generator's included). On a shared 2-core machine
# whose speed drifts by a third within minutes, only runs made back to back compare;
# the ratio of each pair is the figure.
#
#   scripts/throughput-pairs.sh /tmp/agentq-before bin/agentq [N]
#
# AGENTQ_LOADGEN names the load generator as for throughput.sh; without it, bin/loadgen is
# built once here, so that every run uses the same one. NOOTEL=1 (no trace export, as a
# deployment without a collector) passes through to throughput.sh.
set -u
A=$1; B=$2; N=${3:-3}
here=$(dirname "$0")
if [ -z "${AGENTQ_LOADGEN:-}" ]; then
  make -s -C "$here/.." loadgen >&2 || exit 1
  AGENTQ_LOADGEN=$(cd "$here/.." && pwd)/bin/loadgen; export AGENTQ_LOADGEN
fi
# run BIN prints: tasks/s, agentq, Redis and Postgres CPU ms per task, machine busy ms per task
run() { "$here/throughput.sh" "$1" 2>/dev/null | head -3 | python3 -c '
import sys, json, re
l = sys.stdin.read().splitlines()
try:
    d = json.loads(l[0]); c = [float(x) for x in re.findall(r"[0-9.]+", l[1])]; m = re.findall(r"[0-9.]+", l[2])
    print(round(d["tasks_per_s"]) if not d.get("errors") else 0, c[1], c[2], c[3], m[0])
except Exception:
    print(0, 0, 0, 0, 0)'; }
ra=(); rb=()
for i in $(seq "$N"); do
  a=$(run "$A"); b=$(run "$B")
  echo "pair $i: A $a | B $b   (tasks/s, CPU ms per task of agentq redis postgres, machine busy ms per task)"
  ra+=("$a"); rb+=("$b")
done
python3 - "$N" "${ra[@]}" "${rb[@]}" <<'PY'
import sys, statistics as st
n = int(sys.argv[1]); a = [list(map(float, x.split())) for x in sys.argv[2:2 + n]]; b = [list(map(float, x.split())) for x in sys.argv[2 + n:]]
if any(r[0] == 0 for r in a + b): print("a run failed or had errors: no figure"); sys.exit(1)
cpu = lambda r: r[1] + r[2] + r[3]
for name, side in (("A", a), ("B", b)):
    print("median %s: %.0f tasks/s; CPU ms per task agentq %.2f redis %.2f postgres %.2f (together %.2f); machine busy %.2f ms per task" % (
        name, st.median(r[0] for r in side), st.median(r[1] for r in side), st.median(r[2] for r in side),
        st.median(r[3] for r in side), st.median(cpu(r) for r in side), st.median(r[4] for r in side)))
print("median B/A per pair: tasks/s %.2f; CPU per task (agentq+redis+postgres) %.2f; machine busy per task %.2f" % (
    st.median(y[0] / x[0] for x, y in zip(a, b)), st.median(cpu(y) / cpu(x) for x, y in zip(a, b)),
    st.median(y[4] / x[4] for x, y in zip(a, b))))
PY
