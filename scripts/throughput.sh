#!/bin/bash
# One run of the load generator (internal/bench/loadgen) against `BIN serve`, set up as
# a production-like deployment would be: a fresh Postgres database and Redis db 14, an
# OTLP receiver taking traces and metrics, the load generator's default load. Prints its
# JSON line, then the CPU seconds per 1,000 tasks of the agentq process, Redis and every
# Postgres backend, then the whole machine's busy and idle milliseconds per task
# (/proc/stat); then, for each of "river" and "asynq" named after BIN, the same load
# through River on a fresh database, or through plain asynq on the same Redis db, and
# the machine's time per job: the same-run baselines.
# With pg_stat_statements loaded in the server, also the top statements.
#
#   make build
#   scripts/throughput.sh bin/agentq [river] [asynq]
#
# NOOTEL=1 runs it without the OTLP exporter variables (tracing's cost);
# PPROF_ADDR=host:port serves pprof from the agentq process (AGENTQ_PPROF_ADDR);
# DBPARAMS="&name=value" adds connection parameters to DATABASE_URL (a Postgres
# setting to try); TIMELINE=1 writes the run's timeline (scripts/throughput-timeline.py)
# to /tmp/throughput-timeline.log. With pg_stat_statements.track_planning on, the
# statements' planning time shows beside their running time.
#
# The load generator is built to bin/loadgen (make loadgen) unless AGENTQ_LOADGEN names
# another binary, or a wrapper giving it flags (-tasks 16000 for a run long enough to
# profile); the figures per task divide by the tasks it reports.
#
# Nothing else may use Redis db 14 meanwhile (a stray agentq on it takes tasks).
set -u
BIN=$1; shift
if [ -z "${AGENTQ_LOADGEN:-}" ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  make -s -C "$root" loadgen >&2 || exit 1
  AGENTQ_LOADGEN=$root/bin/loadgen
fi
DB=tp_$$
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $DB" >/dev/null
redis-cli -n 14 flushdb >/dev/null
PORT=$(free_port); OP=$(free_port)
python3 - "$OP" <<'PY' >/dev/null 2>&1 &
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0)); self.rfile.read(n)
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf"); self.end_headers()
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
SINK=$!
[ -n "${NOOTEL:-}" ] || export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$OP" OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=500 OTEL_METRIC_EXPORT_INTERVAL=1000
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB?sslmode=disable${DBPARAMS:-}" REDIS_URL=redis://127.0.0.1:6379/14 \
  AGENTQ_PPROF_ADDR=${PPROF_ADDR:-} AGENTQ_ADMIN_TOKEN=tpadmin AGENTQ_HTTP_ADDR=127.0.0.1:$PORT "$BIN" serve >/tmp/throughput-serve.log 2>&1 &
SRV=$!
cleanup() {
  kill $SRV $SINK 2>/dev/null; wait $SRV 2>/dev/null
  psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
  psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS ${DB}_r WITH (FORCE)" >/dev/null 2>&1
}
trap cleanup EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.1; done
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
rcpu() { redis-cli info cpu | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.2f", s}'; }
pgcpu() { local s=0; for p in $(pgrep -x postgres); do s=$((s+$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done; echo $s; }
stmts=$(psql -h 127.0.0.1 -U postgres -Atc "select 1 from pg_extension where extname='pg_stat_statements'" 2>/dev/null)
[ -n "$stmts" ] && psql -q -h 127.0.0.1 -U postgres -c "select pg_stat_statements_reset()" >/dev/null
tick=$(getconf CLK_TCK)
# the whole machine's busy and idle jiffies (user nice system irq softirq steal; idle iowait)
machine() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat; }
# tasks (or jobs) a load generator's JSON line says it ran
ran() { python3 -c 'import sys,json; print(json.loads(sys.argv[1])["tasks"])' "$1" 2>/dev/null || echo 0; }
per_task() { python3 -c "t=$tick; n=max($5,1); print('machine ms per task: busy %.2f idle %.2f' % (($3-$1)*1000/t/n, ($4-$2)*1000/t/n))"; }
a0=$(cpu $SRV); r0=$(rcpu); p0=$(pgcpu); read -r m0 i0 < <(machine)
[ -n "${TIMELINE:-}" ] && python3 "$(dirname "$0")/throughput-timeline.py" "$PORT" "$SRV" >/tmp/throughput-timeline.log 2>&1 &
out=$("$AGENTQ_LOADGEN" agentq "http://127.0.0.1:$PORT" tpadmin); echo "$out"
a1=$(cpu $SRV); r1=$(rcpu); p1=$(pgcpu); read -r m1 i1 < <(machine)
n=$(ran "$out")
python3 -c "t=$tick; k=max($n,1)/1000; print('cpu s/1000 tasks: agentq %.2f redis %.2f postgres %.2f' % (($a1-$a0)/t/k, ($r1-$r0)/k, ($p1-$p0)/t/k))"
per_task "$m0" "$i0" "$m1" "$i1" "$n"
[ -n "$stmts" ] && psql -h 127.0.0.1 -U postgres -c "select calls, round(total_exec_time::numeric) ms, round(total_plan_time::numeric) plan, plans, left(regexp_replace(query, '\s+', ' ', 'g'), 100) q
  from pg_stat_statements where dbid = (select oid from pg_database where datname = '$DB') order by total_exec_time desc limit 40"
for mode in "$@"; do
  case $mode in
  river)
    psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE ${DB}_r" >/dev/null
    target="postgres://postgres@127.0.0.1:5432/${DB}_r?sslmode=disable" ;;
  asynq) target=redis://127.0.0.1:6379/14 ;;
  *) echo "unknown baseline $mode (river, asynq)" >&2; continue ;;
  esac
  read -r m0 i0 < <(machine)
  out=$("$AGENTQ_LOADGEN" "$mode" "$target"); echo "$out"
  read -r m1 i1 < <(machine)
  per_task "$m0" "$i0" "$m1" "$i1" "$(ran "$out")"
done
