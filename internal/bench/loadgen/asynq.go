package main

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// asynqCheckInterval is how often an idle asynq server looks for tasks: agentq's
// workers' interval, so that the two wait alike.
const asynqCheckInterval = 10 * time.Millisecond

// runAsynq puts the load through plain asynq on a queue of its own (no durable store,
// no HTTP, no admission): the ceiling of a Redis queue on this machine. The queue's
// keys are deleted afterwards.
func runAsynq(ctx context.Context, c config) (result, error) {
	opt := &redis.Options{Addr: c.target}
	if strings.Contains(c.target, "://") {
		var err error
		if opt, err = redis.ParseURL(c.target); err != nil {
			return result{}, err
		}
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return result{}, err
	}
	queue := "loadgen-" + runID()
	defer deleteQueue(context.WithoutCancel(ctx), rdb, queue)
	ends := make(chan bool, c.tasks)
	mux := asynq.NewServeMux()
	mux.HandleFunc("sim", func(ctx context.Context, t *asynq.Task) error {
		var a simArgs
		err := json.Unmarshal(t.Payload(), &a)
		if err == nil {
			err = simRun(ctx, a)
		}
		ends <- err == nil
		return err
	})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency: c.workers, Queues: map[string]int{queue: 1}, TaskCheckInterval: asynqCheckInterval,
		LogLevel: asynq.ErrorLevel,
	})
	if err := srv.Start(mux); err != nil {
		return result{}, err
	}
	defer srv.Shutdown()
	client := asynq.NewClientFromRedisClient(rdb)
	payload, _ := json.Marshal(simArgs{Steps: c.steps, StepMs: c.stepMs})
	start := time.Now()
	took, errs, firstErr := produce(c.tasks, c.concurrency, func(int) error {
		_, err := client.EnqueueContext(ctx, asynq.NewTask("sim", payload), asynq.Queue(queue), asynq.MaxRetry(0))
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

// deleteQueue removes the run's queue from asynq's keys: its own, under its hash tag,
// and its name in the set of queues.
func deleteQueue(ctx context.Context, rdb *redis.Client, queue string) {
	iter := rdb.Scan(ctx, 0, "asynq:{"+queue+"}:*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			rdb.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(ctx, batch...)
	}
	rdb.SRem(ctx, "asynq:queues", queue)
}
