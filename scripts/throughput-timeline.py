#!/usr/bin/env python3
# Prints, every 250 ms until the agentq at 127.0.0.1:PORT stops answering, the tasks
# admitted, dispatched and finished in that interval (from /metrics), how idle the
# machine was (/proc/stat), and, given the agentq process's PID, the CPU milliseconds
# the interval took of agentq, of Redis and of every Postgres process.
# scripts/throughput.sh runs it beside the load generator when TIMELINE is set, into
# /tmp/throughput-timeline.log: it shows a run's two halves (submissions, then the
# backlog's drain), whether each is bound by CPU, and what each costs: an interval's
# CPU over its finished tasks, in the drain, is a task's run without its submission.
#
#   python3 scripts/throughput-timeline.py PORT [PID]
import os, re, sys, time, urllib.request
port = sys.argv[1]
pid = sys.argv[2] if len(sys.argv) > 2 else None
tick = os.sysconf('SC_CLK_TCK')
def stat():
    v = list(map(int, open('/proc/stat').readline().split()[1:]))
    return sum(v), v[3] + v[4]
def comm(p):
    try:
        return open(f'/proc/{p}/comm').read().strip()
    except OSError:
        return ''
def cpu(p):  # user + system jiffies of process p, 0 once it is gone
    try:
        f = open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()
        return int(f[11]) + int(f[12])
    except (OSError, IndexError):
        return 0
def procs():  # agentq, Redis, Postgres jiffies
    ps = [p for p in os.listdir('/proc') if p.isdigit()]
    return (cpu(pid) if pid else 0, sum(cpu(p) for p in ps if comm(p) == 'redis-server'),
            sum(cpu(p) for p in ps if comm(p) == 'postgres'))
prev, pp = stat(), procs(); pf = None; t0 = time.time()
while True:
    try:
        m = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=1).read().decode()
    except Exception:
        break
    f = sum(float(x) for x in re.findall(r'^agentq_tasks_finished_total\{[^}]*\} (\S+)', m, re.M))
    d = sum(float(x) for x in re.findall(r'^agentq_dispatched_total(?:\{[^}]*\})? (\S+)', m, re.M))
    a = sum(float(x) for x in re.findall(r'^agentq_admissions_total\{[^}]*outcome="admitted"[^}]*\} (\S+)', m, re.M))
    cur, cp = stat(), procs()
    tot, idle = cur[0] - prev[0], cur[1] - prev[1]
    ms = [(y - x) * 1000 // tick for x, y in zip(pp, cp)]
    prev, pp = cur, cp
    if pf is not None:
        line = f"{time.time()-t0:5.2f} admitted {a-pa:5.0f} dispatched {d-pd:5.0f} finished {f-pf:5.0f} idle {100*idle/max(tot,1):3.0f}%"
        if pid:
            line += f" cpu ms agentq {ms[0]:4d} redis {ms[1]:4d} postgres {ms[2]:4d}"
        print(line, flush=True)
    pf, pd, pa = f, d, a
    time.sleep(0.25)
