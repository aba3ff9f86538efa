// Package redisx opens agentq's Redis client.
package redisx

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Connect opens a client on url and checks that Redis answers.
func Connect(ctx context.Context, url string) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL is not a valid Redis URL: %w", err)
	}
	opt.DialTimeout = 2 * time.Second
	opt.ReadTimeout = 2 * time.Second
	opt.WriteTimeout = 2 * time.Second
	opt.PoolSize = max(opt.PoolSize, 64)
	c := redis.NewClient(opt)
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
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			c.Del(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Del(ctx, batch...)
	}
}
