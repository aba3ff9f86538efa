#!/usr/bin/env python3
"""CPU cost of one GET /v1/usage call: polls it N times over one keep-alive
connection and prints, per call, the wall time, the agentq process's CPU (from
/proc/PID/stat) and the CPU of every Postgres process.

    scripts/usage-poll.py PORT TENANT_KEY N AGENTQ_PID

Run it against a server whose tenant holds the backlog to measure (for example
`agentq serve --roles api` with 1,000 tasks submitted and no worker), after a
warm-up run, with nothing else using Postgres.
"""
import glob
import http.client
import os
import sys
import time

port, key, n, pid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tick = os.sysconf("SC_CLK_TCK")


def cpu(p):
    try:
        f = open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except OSError:
        return 0


def postgres():
    total = 0
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            if open(comm).read().strip() == "postgres":
                total += cpu(int(comm.split("/")[2]))
        except OSError:
            pass
    return total


c = http.client.HTTPConnection("127.0.0.1", port)
a0, p0, t0 = cpu(pid), postgres(), time.time()
for _ in range(n):
    c.request("GET", "/v1/usage", headers={"Authorization": "Bearer " + key})
    r = c.getresponse()
    r.read()
    if r.status != 200:
        sys.exit("GET /v1/usage answered %d" % r.status)
a1, p1, t1 = cpu(pid), postgres(), time.time()
print("per call: wall %.0f us, agentq cpu %.0f us, postgres cpu %.0f us"
      % ((t1 - t0) / n * 1e6, (a1 - a0) / tick / n * 1e6, (p1 - p0) / tick / n * 1e6))
