// Package redisx opens agentq's Redis client.
package redisx

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Open connects to the Redis Cluster of clusterAddrs when any is given (the
// deployment's REDIS_CLUSTER_ADDRS), else to the single Redis at url, and checks that
// it answers: on a cluster, every master.
func Open(ctx context.Context, url string, clusterAddrs []string) (redis.UniversalClient, error) {
	if len(clusterAddrs) == 0 {
		return Connect(ctx, url)
	}
	return ConnectCluster(ctx, clusterAddrs)
}

// ConnectCluster opens a Redis Cluster client seeded with addrs (host:port of any of
// its nodes; it discovers the rest) and checks that every master answers.
func ConnectCluster(ctx context.Context, addrs []string) (*redis.ClusterClient, error) {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:       addrs,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		// A call's context deadline bounds its reads and writes (go-redis ignores it
		// otherwise): admission's AGENTQ_REDIS_TIMEOUT, and the reads it decorates,
		// end at their deadline rather than at ReadTimeout, retries included.
		ContextTimeoutEnabled: true,
		PoolSize:              64, // per node
		// A failover moves slots to a promoted replica: follow MOVED/ASK redirections
		// for longer than the default while the cluster settles.
		MaxRedirects: 8,
	})
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := c.ForEachMaster(pctx, func(ctx context.Context, m *redis.Client) error {
		return m.Ping(ctx).Err()
	})
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("redis cluster at %v is not reachable: %w", addrs, err)
	}
	return c, nil
}

// Options sets on opt the timeouts of agentq's connection to a single Redis and
// returns it: 2 s to dial, read or write, and a call's context deadline bounding its
// reads and writes too (go-redis ignores it otherwise), so that admission's
// AGENTQ_REDIS_TIMEOUT, and the reads it decorates, end at their deadline rather than
// at the read timeout, retries included.
func Options(opt *redis.Options) *redis.Options {
	opt.DialTimeout = 2 * time.Second
	opt.ReadTimeout = 2 * time.Second
	opt.WriteTimeout = 2 * time.Second
	opt.ContextTimeoutEnabled = true
	return opt
}

// Connect opens a client on url and checks that Redis answers.
func Connect(ctx context.Context, url string) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL is not a valid Redis URL: %w", err)
	}
	if !strings.Contains(url, "pool_size=") { // the URL's size, when it names one, stands
		opt.PoolSize = max(opt.PoolSize, 64)
	}
	c := redis.NewClient(Options(opt))
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("redis at %s is not reachable: %w", opt.Addr, err)
	}
	return c, nil
}

// DeletePrefix deletes every key starting with prefix (test and benchmark clean-up;
// SCAN-based, so it does not block the server).
func DeletePrefix(ctx context.Context, c redis.UniversalClient, prefix string) {
	if cc, ok := c.(*redis.ClusterClient); ok { // SCAN walks one node: walk every master
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			deletePrefix(ctx, m, prefix, true)
			return nil
		})
		return
	}
	deletePrefix(ctx, c, prefix, false)
}

// deletePrefix deletes a node's keys under prefix; on a cluster node one key per DEL,
// since a DEL of keys in several slots is refused.
func deletePrefix(ctx context.Context, c redis.Cmdable, prefix string, cluster bool) {
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	flush := func() {
		if cluster {
			pipe := c.Pipeline()
			for _, k := range batch {
				pipe.Del(ctx, k)
			}
			_, _ = pipe.Exec(ctx)
		} else {
			c.Del(ctx, batch...)
		}
		batch = batch[:0]
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			flush()
		}
	}
	if len(batch) > 0 {
		flush()
	}
}
