#!/usr/bin/env python3
# Prints, every 250 ms until the agentq at 127.0.0.1:PORT stops answering, the tasks
# admitted, dispatched and finished in that interval (from /metrics) and how idle the
# machine was (/proc/stat). scripts/throughput.sh runs it beside the load generator when TIMELINE
# is set, into /tmp/throughput-timeline.log: it shows a run's two halves (submissions,
# then the backlog's drain) and whether each is bound by CPU.
#
#   python3 scripts/throughput-timeline.py PORT
import time, sys, urllib.request, re
port = sys.argv[1]
def stat():
    l = open('/proc/stat').readline().split()[1:]
    v = list(map(int, l)); return sum(v), v[3]+v[4]
prev = stat(); pf = None; t0=time.time()
while True:
    try:
        m = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=1).read().decode()
    except Exception:
        break
    f = sum(float(x) for x in re.findall(r'^agentq_tasks_finished_total\{[^}]*\} (\S+)', m, re.M))
    d = sum(float(x) for x in re.findall(r'^agentq_dispatched_total(?:\{[^}]*\})? (\S+)', m, re.M))
    a = sum(float(x) for x in re.findall(r'^agentq_admissions_total\{[^}]*outcome="admitted"[^}]*\} (\S+)', m, re.M))
    cur = stat()
    tot, idle = cur[0]-prev[0], cur[1]-prev[1]; prev = cur
    if pf is not None:
        print(f"{time.time()-t0:5.2f} admitted {a-pa:5.0f} dispatched {d-pd:5.0f} finished {f-pf:5.0f} idle {100*idle/max(tot,1):3.0f}%", flush=True)
    pf, pd, pa = f, d, a
    time.sleep(0.25)
