// Package testenv gives each test its own Postgres schema and Redis key prefix on the
// real services, so tests run in parallel without seeing each other.
//
// AGENTQ_TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/agentq_test)
// names the database, created if missing; AGENTQ_TEST_REDIS_URL (default
// redis://127.0.0.1:6379/9) the Redis.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/agentq/agentq/internal/pg"
	"github.com/agentq/agentq/internal/redisx"
	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/migrations"
)

// DatabaseURL is the test database.
func DatabaseURL() string {
	if v := os.Getenv("AGENTQ_TEST_DATABASE_URL"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/agentq_test?sslmode=disable"
}

// RedisURL is the test Redis.
func RedisURL() string {
	if v := os.Getenv("AGENTQ_TEST_REDIS_URL"); v != "" {
		return v
	}
	return "redis://127.0.0.1:6379/9"
}

// ID returns a short random id for names.
func ID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var createOnce sync.Once
var createErr error

func ensureDatabase(ctx context.Context) error {
	createOnce.Do(func() {
		u, err := url.Parse(DatabaseURL())
		if err != nil {
			createErr = err
			return
		}
		name := strings.TrimPrefix(u.Path, "/")
		u.Path = "/postgres"
		conn, err := pgx.Connect(ctx, u.String())
		if err != nil {
			createErr = err
			return
		}
		defer conn.Close(ctx)
		var exists bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
			createErr = err
			return
		}
		if !exists {
			_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
			var pgErr *pgconn.PgError
			if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505")) {
				createErr = err
			}
		}
	})
	return createErr
}

// Schema creates a fresh schema, migrates it, and returns its name and a pool pinned
// to it. The schema is dropped when the test ends.
func Schema(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	schema, pool, drop, err := OpenSchema()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(drop)
	return schema, pool
}

// OpenSchema is Schema outside a test (Examples): drop closes the pool and drops the
// schema.
func OpenSchema() (schema string, pool *pgxpool.Pool, drop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := ensureDatabase(ctx); err != nil {
		return "", nil, nil, fmt.Errorf("test database: %w (is Postgres running? `make test` starts it)", err)
	}
	schema = "t_" + ID()
	admin, err := pg.Connect(ctx, DatabaseURL(), "")
	if err != nil {
		return "", nil, nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		return "", nil, nil, fmt.Errorf("create schema: %w", err)
	}
	drop = func() {
		if pool != nil {
			pool.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	}
	if pool, err = pg.Connect(ctx, DatabaseURL(), schema); err != nil {
		drop()
		return "", nil, nil, err
	}
	if _, err := migrations.Up(ctx, pool); err != nil {
		drop()
		return "", nil, nil, fmt.Errorf("migrate: %w", err)
	}
	return schema, pool, drop, nil
}

// Postgres is Schema without the name.
func Postgres(t testing.TB) *pgxpool.Pool {
	_, pool := Schema(t)
	return pool
}

// Redis returns a client and a key builder with a prefix of the test's own. Every key
// under the prefix (and the prefix's asynq queues) is deleted when the test ends.
func Redis(t testing.TB, shards int) (*redis.Client, rkeys.Keys) {
	t.Helper()
	c, keys, done, err := OpenRedis(shards)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(done)
	return c, keys
}

// OpenRedis is Redis outside a test (Examples): done deletes the prefix's keys and
// closes the client.
func OpenRedis(shards int) (c *redis.Client, keys rkeys.Keys, done func(), err error) {
	opt, err := redis.ParseURL(RedisURL())
	if err != nil {
		return nil, keys, nil, err
	}
	opt.PoolSize = 64
	c = redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		return nil, keys, nil, fmt.Errorf("Redis at %s: %w (is Redis running? `make test` starts it)", opt.Addr, err)
	}
	keys = rkeys.New("t"+ID()+":", shards)
	done = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		DeletePrefix(ctx, c, keys.Prefix())
		DeletePrefix(ctx, c, keys.AsynqKeyPrefix())
		_ = c.Close()
	}
	return c, keys, done, nil
}

// DeletePrefix deletes every key starting with prefix.
func DeletePrefix(ctx context.Context, c redis.UniversalClient, prefix string) {
	redisx.DeletePrefix(ctx, c, prefix)
}

// DeadRedis is a client of a Redis that is not there: every call fails at once, as
// when the server is down. It dials once per call, not go-redis's default five times
// with a pause between, so a test of degraded mode sees the refusal, not the retries.
func DeadRedis(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}
