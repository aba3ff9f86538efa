#!/usr/bin/env python3
"""Measure what each role costs with the roles in separate processes.

Starts a local 3-master Redis Cluster (or, with --single, uses one Redis), a fresh
Postgres database, and three agentq processes: api, scheduler+janitor, worker. Then:

  1. runs the load generator's agentq load (internal/bench/loadgen, built to
     bin/loadgen unless --loadgen PATH or the AGENTQ_LOADGEN environment variable names
     another binary) against the API and
     reads each process's CPU time (/proc/<pid>/stat) before and after: CPU seconds
     per 1,000 tasks per role, Redis and Postgres included;
  2. counts the connections each side holds (pg_stat_activity, INFO clients);
  3. with the worker stopped, queues tasks and reads Redis's used_memory before and
     after: bytes per queued task. (Bytes per tenant: `agentq bench admission`.)

Prints one JSON object. Needs redis-server, redis-cli, psql, a built bin/agentq (make
build). Nothing else may use the Redis or Postgres meanwhile.

  python3 scripts/split-roles.py [--single] [--tasks 4000] [--loadgen PATH]
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, threading, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--loadgen", default=os.environ.get("AGENTQ_LOADGEN"),
                help="the load generator binary (default: $AGENTQ_LOADGEN, else bin/loadgen built by make loadgen)")
ap.add_argument("--bin", default="bin/agentq")
ap.add_argument("--single", action="store_true", help="one Redis (REDIS_URL db 13) instead of a cluster")
ap.add_argument("--tasks", type=int, default=4000)
ap.add_argument("--queued", type=int, default=2000)
args = ap.parse_args()
if not args.loadgen:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(["make", "-s", "-C", root, "loadgen"], check=True, stdout=sys.stderr)
    args.loadgen = os.path.join(root, "bin", "loadgen")

TICK = os.sysconf("SC_CLK_TCK")
ADMIN = "split-admin"
DB = "agentq_split"
PG = "postgres://postgres@127.0.0.1:5432/" + DB + "?sslmode=disable"
procs = []
tmp = tempfile.mkdtemp(prefix="agentq-split-")


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(tmp, ignore_errors=True)


def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / TICK


def pids_of(name):
    out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def cpu_all(pids):
    total = 0.0
    for p in pids:
        try:
            total += cpu(p)
        except FileNotFoundError:
            pass
    return total


def http(method, base, path, token, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
        return json.loads(raw) if raw else None


def wait_health(base):
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1)
            return
        except Exception:
            time.sleep(0.1)
    sys.exit("agentq at %s did not come up" % base)


def redis_nodes():
    return [("127.0.0.1", 6379)] if args.single else [("127.0.0.1", p) for p in (7201, 7202, 7203)]


def redis_info(field, section):
    total = 0
    for host, port in redis_nodes():
        out = subprocess.run(["redis-cli", "-h", host, "-p", str(port), "info", section], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith(field + ":"):
                total += int(line.split(":")[1])
    return total


def start_agentq(port, roles, extra_env):
    env = dict(os.environ, AGENTQ_HTTP_ADDR=f"127.0.0.1:{port}", DATABASE_URL=PG, AGENTQ_ADMIN_TOKEN=ADMIN,
               AGENTQ_REDIS_PREFIX="split:", AGENTQ_PUBLIC_URL="http://127.0.0.1:18301", **extra_env)
    log = open(os.path.join(tmp, f"agentq-{port}.log"), "w")
    p = subprocess.Popen([args.bin, "serve", "--roles", roles], env=env, stdout=log, stderr=log)
    procs.append(p)
    wait_health(f"http://127.0.0.1:{port}")
    return p


try:
    env = {}
    if args.single:
        env["REDIS_URL"] = "redis://127.0.0.1:6379/13"
        subprocess.run(["redis-cli", "-n", "13", "flushdb"], check=True, capture_output=True)
    else:
        for port in (7201, 7202, 7203):
            d = os.path.join(tmp, str(port))
            os.makedirs(d)
            procs.append(subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                                           "--cluster-config-file", os.path.join(d, "nodes.conf"), "--dir", d, "--save", "",
                                           "--appendonly", "no", "--logfile", os.path.join(d, "log")]))
        time.sleep(1)
        subprocess.run(["redis-cli", "--cluster", "create", "127.0.0.1:7201", "127.0.0.1:7202", "127.0.0.1:7203",
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True)
        time.sleep(2)
        env["REDIS_CLUSTER_ADDRS"] = "127.0.0.1:7201,127.0.0.1:7202,127.0.0.1:7203"
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"DROP DATABASE IF EXISTS {DB}"], check=True, capture_output=True)
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {DB}"], check=True, capture_output=True)

    api = start_agentq(18301, "api", env)
    sched = start_agentq(18302, "scheduler,janitor", env)
    worker = start_agentq(18303, "worker", env)
    base = "http://127.0.0.1:18301"
    time.sleep(2)

    roles = {"api": [api.pid], "scheduler+janitor": [sched.pid], "worker": [worker.pid],
             "redis": [p for p in pids_of("redis-server") if args.single or p in [q.pid for q in procs]],
             "postgres": pids_of("postgres")}
    before = {k: cpu_all(v) for k, v in roles.items()}
    lc = subprocess.run([args.loadgen, "-tasks", str(args.tasks), "agentq", base, ADMIN], capture_output=True, text=True)
    roles["postgres"] = pids_of("postgres")  # backends opened meanwhile count from 0
    after = {k: cpu_all(v) for k, v in roles.items()}
    load = json.loads(lc.stdout)
    per1k = {k: round((after[k] - before[k]) / args.tasks * 1000, 2) for k in roles}

    pg_conns = int(subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc",
                                   f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{DB}'"], capture_output=True, text=True).stdout)
    redis_clients = redis_info("connected_clients", "clients")

    # Memory: four tenants that each ran one task, then tasks queued with no worker.
    def tenant(i):
        http("POST", base, "/v1/admin/tenants", ADMIN, {"id": f"m{i}", "plan": "pro", "overrides": {"concurrent_sessions": 100000, "queue_backlog": 100000, "tenant_rate": 100000, "tenant_rate_burst": 100000, "key_rate": 100000, "key_rate_burst": 100000, "user_tasks_hourly": 1000000}})
        return http("POST", base, f"/v1/admin/tenants/m{i}/keys", ADMIN, {})["key"]

    keys = [tenant(i) for i in range(4)]
    ids = [http("POST", base, "/v1/tasks", k, {"agent": "sim", "input": {"steps": 1}})["id"] for k in keys]
    for _ in range(600):
        if all(http("GET", base, f"/v1/tasks/{ids[i]}", keys[i])["state"] == "completed" for i in range(len(ids))):
            break
        time.sleep(0.1)
    worker.send_signal(signal.SIGTERM)
    worker.wait(20)
    time.sleep(3)  # the worker's capacity expires: nothing is dispatched
    mem2 = redis_info("used_memory", "memory")
    n = args.queued
    per = n // 4
    errs = []

    def submit(k):
        for _ in range(per):
            try:
                http("POST", base, "/v1/tasks", k, {"agent": "sim", "input": {"steps": 1}})
            except Exception as e:  # noqa: BLE001
                errs.append(str(e))
    ts = [threading.Thread(target=submit, args=(k,)) for k in keys]
    [t.start() for t in ts]
    [t.join() for t in ts]
    time.sleep(1)
    mem3 = redis_info("used_memory", "memory")
    print(json.dumps({
        "redis": "single" if args.single else "cluster of 3 masters",
        "tasks": args.tasks, "agentq_tasks_per_s": load["tasks_per_s"], "loadgen_errors": load["errors"],
        "cpu_s_per_1000_tasks": per1k,
        "postgres_connections": pg_conns, "redis_clients": redis_clients,
        "redis_bytes_per_queued_task": round((mem3 - mem2) / (n - len(errs))),
        "queued_submission_errors": len(errs),
    }))
finally:
    cleanup()
