package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentq/agentq/agentqtype"
)

// Agent is an HTTP agent registered by the operator.
type Agent struct {
	Name         string
	URL          string
	StepTimeoutS float64
	Headers      map[string]string
	// SigningSecretCreatedAt is when the agent's own signing secret was made; nil
	// for an agent registered before per-agent secrets (signed with the shared one).
	SigningSecretCreatedAt *time.Time
	CreatedAt              time.Time
	UpdatedAt              time.Time
	// SigningSecret is the agent's own signing key ("" for such an agent). It is for
	// the worker only: never shown by reads, never logged.
	SigningSecret string
}

const agentCols = `name, url, step_timeout_s, headers, signing_secret_created_at, created_at, updated_at, COALESCE(signing_secret, '')`

func scanAgent(row pgx.Row) (Agent, error) {
	a, _, err := scanAgentRow(row, false)
	return a, err
}

// scanAgentRow scans agentCols, and a trailing created flag when withCreated.
func scanAgentRow(row pgx.Row, withCreated bool) (a Agent, created bool, err error) {
	var h []byte
	dst := []any{&a.Name, &a.URL, &a.StepTimeoutS, &h, &a.SigningSecretCreatedAt, &a.CreatedAt, &a.UpdatedAt, &a.SigningSecret}
	if withCreated {
		dst = append(dst, &created)
	}
	if err := row.Scan(dst...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return a, false, agentqtype.ErrNotFound
		}
		return a, false, err
	}
	a.Headers = map[string]string{}
	return a, created, json.Unmarshal(h, &a.Headers)
}

// PutAgentParams create or replace an HTTP agent.
type PutAgentParams struct {
	Name         string
	URL          string
	StepTimeoutS float64
	Headers      map[string]string
	// SigningSecret is stored when the agent is created; replacing an agent keeps
	// the secret it has.
	SigningSecret string
}

// PutAgent creates or replaces an agent; created reports which.
func (s *Store) PutAgent(ctx context.Context, p PutAgentParams) (a Agent, created bool, err error) {
	h, err := json.Marshal(nonNil(p.Headers))
	if err != nil {
		return a, false, err
	}
	return scanAgentRow(s.db.QueryRow(ctx, `
		INSERT INTO agents (name, url, step_timeout_s, headers, signing_secret, signing_secret_created_at)
		VALUES ($1, $2, $3, $4, $5, now())
		ON CONFLICT (name) DO UPDATE SET url = $2, step_timeout_s = $3, headers = $4, updated_at = now()
		RETURNING `+agentCols+`, (xmax = 0)`, p.Name, p.URL, p.StepTimeoutS, h, p.SigningSecret), true)
}

// RotateAgentSecret replaces an agent's signing secret; agentqtype.ErrNotFound if
// there is no agent by that name.
func (s *Store) RotateAgentSecret(ctx context.Context, name, secret string) (Agent, error) {
	return scanAgent(s.db.QueryRow(ctx, `
		UPDATE agents SET signing_secret = $2, signing_secret_created_at = now(), updated_at = now()
		WHERE name = $1 RETURNING `+agentCols, name, secret))
}

// GetAgent returns an HTTP agent by name.
func (s *Store) GetAgent(ctx context.Context, name string) (Agent, error) {
	return scanAgent(s.db.QueryRow(ctx, `SELECT `+agentCols+` FROM agents WHERE name = $1`, name))
}

// ListAgents returns every HTTP agent, by name.
func (s *Store) ListAgents(ctx context.Context) ([]Agent, error) {
	rows, err := s.db.Query(ctx, `SELECT `+agentCols+` FROM agents ORDER BY name`)
	out, err := collect(rows, err, scanAgent)
	if out == nil && err == nil {
		out = []Agent{}
	}
	return out, err
}

// DeleteAgent removes an HTTP agent; agentqtype.ErrNotFound if there is none by that name.
func (s *Store) DeleteAgent(ctx context.Context, name string) error {
	tag, err := s.db.Exec(ctx, `DELETE FROM agents WHERE name = $1`, name)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return agentqtype.ErrNotFound
	}
	return nil
}

// LockAgent reads an HTTP agent and locks its row for the rest of the transaction;
// agentqtype.ErrNotFound if there is none.
func (s *Store) LockAgent(ctx context.Context, name string) (Agent, error) {
	return scanAgent(s.db.QueryRow(ctx, `SELECT `+agentCols+` FROM agents WHERE name = $1 FOR UPDATE`, name))
}

// SetAgentSettingsParams are an agent's URL and step timeout.
type SetAgentSettingsParams struct {
	Name         string
	URL          string
	StepTimeoutS float64
}

// SetAgentSettings changes an agent's URL and step timeout, keeping its headers and
// signing secret (a revert's restore); agentqtype.ErrNotFound if there is none.
func (s *Store) SetAgentSettings(ctx context.Context, p SetAgentSettingsParams) (Agent, error) {
	return scanAgent(s.db.QueryRow(ctx, `UPDATE agents SET url = $2, step_timeout_s = $3, updated_at = now()
		WHERE name = $1 RETURNING `+agentCols, p.Name, p.URL, p.StepTimeoutS))
}
