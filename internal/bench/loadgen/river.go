package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// simWorker runs River's sim jobs.
type simWorker struct {
	river.WorkerDefaults[simArgs]
}

func (simWorker) Work(ctx context.Context, job *river.Job[simArgs]) error {
	return simRun(ctx, job.Args)
}

// runRiver migrates River's tables into the database of c.target, then puts the load
// through one River client with c.workers slots: jobs are inserted one at a time by
// the producers, like agentq's submissions, and end when River reports them.
func runRiver(ctx context.Context, c config) (result, error) {
	pcfg, err := pgxpool.ParseConfig(c.target)
	if err != nil {
		return result{}, err
	}
	if !strings.Contains(c.target, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, 16) // as agentq's own pool
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return result{}, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return result{}, fmt.Errorf("migrating: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &simWorker{})
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: c.workers}},
		Workers:       workers,
		FetchCooldown: c.fetchCooldown,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return result{}, err
	}
	return riverLoad(ctx, c, client)
}

func riverLoad(ctx context.Context, c config, client *river.Client[pgx.Tx]) (result, error) {
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: c.tasks + 1, // none dropped: every end is counted
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
	})
	defer unsubscribe()
	ends := make(chan bool, c.tasks)
	go func() {
		for e := range events {
			ends <- e.Kind == river.EventKindJobCompleted
		}
	}()
	if err := client.Start(ctx); err != nil {
		return result{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	}()
	args := simArgs{Steps: c.steps, StepMs: c.stepMs}
	start := time.Now()
	took, errs, firstErr := produce(c.tasks, c.concurrency, func(int) error {
		_, err := client.Insert(ctx, args, &river.InsertOpts{MaxAttempts: 1})
		return err
	})
	ran := int64(c.tasks) - errs
	notCompleted, err := waitEnds(ctx, ends, ran)
	if err != nil {
		return result{}, err
	}
	r := newResult(c, ran, time.Since(start), took, errs, firstErr)
	r.NotCompleted = notCompleted
	return r, nil
}
