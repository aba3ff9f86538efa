package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/tasks"
	"github.com/agentq/agentq/quotas"
)

// streamEvent is a state event of the progress stream, as the worker publishes them.
type streamEvent struct {
	Type  string `json:"type"`
	State string `json:"state,omitempty"`
}

// taskEvents streams a task's progress as Server-Sent Events: its current state first,
// then one event per state change and per finished step, ending after the terminal
// state. An open stream holds an inflight_requests slot (taken by the inflight
// middleware, refreshed by the keep-alive below), never an agent session: a tenant
// may watch the task that holds its only session.
func (s *Server) taskEvents(c echo.Context) error {
	ctx := c.Request().Context()
	id, err := taskID(c)
	if err != nil {
		return err
	}
	key := keyRecord(c)
	// Another tenant's task, one outside the key's scopes, or none: 404 before
	// anything is subscribed.
	if _, err := s.Tasks.StoredIn(ctx, key.TenantID, keyScope(c), id); errors.Is(err, agentqtype.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No task %s.", id)
	} else if err != nil {
		return err
	}
	// Subscribe before reading the state, so nothing between the two is missed.
	sub := s.Redis.Subscribe(ctx, s.Keys.TaskEvents(id.String()))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		return admissionFailure(quotas.ErrUnavailable)
	}
	task, err := s.Tasks.Stored(ctx, key.TenantID, id)
	if err != nil {
		return err
	}
	w := c.Response()
	h := w.Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set(echo.HeaderCacheControl, "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(event string, data []byte) error {
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data); err != nil {
			return err
		}
		w.Flush()
		return nil
	}
	snapshot := func(t tasks.Task) error {
		tj := taskJSON(s.Tasks.WithWaitReason(ctx, t))
		body, _ := json.Marshal(map[string]any{"type": "state", "task_id": t.ID.String(), "state": t.State, "task": tj})
		return send("state", body)
	}
	if err := snapshot(task); err != nil || task.State.Terminal() {
		return nil
	}
	msgs := sub.Channel()
	poll := time.NewTicker(time.Second) // the terminal state arrives even if a message is lost
	defer poll.Stop()
	keepalive := time.NewTicker(quotas.InflightLeaseTTL / 4)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			var ev streamEvent
			if json.Unmarshal([]byte(m.Payload), &ev) != nil {
				continue
			}
			if ev.Type == "state" && tasks.Terminal(ev.State) {
				// end with the stored task, which holds the final usage and output
				if t, err := s.Tasks.Stored(ctx, key.TenantID, id); err == nil {
					return snapshot(t)
				}
				return send("state", []byte(m.Payload))
			}
			if err := send(ev.Type, []byte(m.Payload)); err != nil {
				return nil
			}
		case <-poll.C:
			t, err := s.Tasks.Stored(ctx, key.TenantID, id)
			if err == nil && t.State.Terminal() {
				return snapshot(t)
			}
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return nil
			}
			w.Flush()
			s.Admission.TouchInflight(ctx, inflightSlot(c))
		case <-s.closing:
			// the server is shutting down: end the stream so shutdown does not wait on
			// it; the client reconnects to another replica
			_, _ = fmt.Fprint(w, "event: shutdown\ndata: {}\n\n")
			w.Flush()
			return nil
		}
	}
}
