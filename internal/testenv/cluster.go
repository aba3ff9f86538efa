package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/redisx"
)

// Cluster is a local Redis Cluster of masters without replicas, started by a test
// from the redis-server and redis-cli on PATH, and stopped when the test ends. A node
// can be killed and restarted: it comes back with its slots and none of its data, as
// a master without persistence does after a crash.
type Cluster struct {
	t     testing.TB
	dir   string
	ports []int

	mu    sync.Mutex
	procs []*exec.Cmd
}

// StartCluster starts a cluster of n masters (n >= 3) and waits until it serves every
// slot. It skips the test when redis-server or redis-cli is missing, unless
// AGENTQ_REQUIRE_CLUSTER is set (CI sets it), which fails it instead.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("AGENTQ_REQUIRE_CLUSTER") != "" {
				t.Fatalf("testenv: %s not found: a Redis Cluster test cannot run", bin)
			}
			t.Skipf("testenv: %s not found", bin)
		}
	}
	c := &Cluster{t: t, dir: t.TempDir()}
	c.ports = freePorts(t, n)
	c.procs = make([]*exec.Cmd, n)
	t.Cleanup(c.stop)
	for i := range n {
		c.startNode(i)
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy()
	return c
}

// Addrs are the nodes' host:port.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.ports))
	for i, p := range c.ports {
		out[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	return out
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client() *redis.ClusterClient {
	c.t.Helper()
	cc, err := redisx.ConnectCluster(context.Background(), c.Addrs())
	if err != nil {
		c.t.Fatalf("testenv: %v", err)
	}
	c.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func (c *Cluster) startNode(i int) {
	c.t.Helper()
	dir := filepath.Join(c.dir, strconv.Itoa(c.ports[i]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(c.ports[i]), "--bind", "127.0.0.1",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
		"--cluster-node-timeout", "2000", "--dir", dir, "--save", "", "--appendonly", "no",
		"--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("testenv: redis-server: %v", err)
	}
	c.mu.Lock()
	c.procs[i] = cmd
	c.mu.Unlock()
	c.waitPing(i)
}

func (c *Cluster) waitPing(i int) {
	c.t.Helper()
	cl := redis.NewClient(&redis.Options{Addr: c.Addrs()[i], MaxRetries: -1})
	defer cl.Close()
	deadline := time.Now().Add(10 * time.Second)
	for cl.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			c.t.Fatalf("testenv: redis node %s does not answer", c.Addrs()[i])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitHealthy waits until every node reports the cluster ok.
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range c.Addrs() {
		cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		for {
			info, err := cl.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				_ = cl.Close()
				c.t.Fatalf("testenv: cluster node %s is not ok: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = cl.Close()
	}
}

// Kill ends node i at once (SIGKILL): its data is gone.
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	c.mu.Lock()
	p := c.procs[i]
	c.procs[i] = nil
	c.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.Process.Kill()
	_ = p.Wait()
}

// Restart starts killed node i again on its port and cluster config: it takes its
// slots back, empty, and the cluster is ok again.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.startNode(i)
	c.WaitHealthy()
}

func (c *Cluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.procs {
		if p != nil {
			_ = p.Process.Kill()
			_ = p.Wait()
			c.procs[i] = nil
		}
	}
}

// freePorts finds n ports that are free, with their cluster bus ports (port + 10000).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var out []int
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if p+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		_ = bus.Close()
		dup := false
		for _, q := range out {
			dup = dup || q == p
		}
		if !dup {
			out = append(out, p)
		}
	}
	if len(out) != n {
		panic(fmt.Sprint("testenv: ports ", out))
	}
	return out
}
