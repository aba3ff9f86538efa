package web

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/agents"
)

// AgentRequest is the body of PUT /v1/admin/agents/{name}.
type AgentRequest struct {
	URL          string            `json:"url"`
	StepTimeoutS *float64          `json:"step_timeout_s"`
	Headers      map[string]string `json:"headers"`
}

// AgentJSON is an HTTP agent as the admin API shows it: header values hidden (they
// often hold the agent's credentials), never its signing secret.
type AgentJSON struct {
	Name         string            `json:"name"`
	URL          string            `json:"url"`
	StepTimeoutS float64           `json:"step_timeout_s"`
	Headers      map[string]string `json:"headers"`
	// SigningSecretCreatedAt is when the agent's own signing secret was made; null
	// for an agent registered before per-agent secrets (signed with the shared one).
	SigningSecretCreatedAt *time.Time `json:"signing_secret_created_at"`
	CreatedAt              time.Time  `json:"created_at"`
	UpdatedAt              time.Time  `json:"updated_at"`
}

// AgentWithSecret is an agent as shown right after its signing secret was made (first
// registration, rotation): the only answers that ever carry the secret.
type AgentWithSecret struct {
	AgentJSON
	SigningSecret string `json:"signing_secret"`
}

func agentJSON(a agents.Agent) AgentJSON {
	return AgentJSON{
		Name: a.Name, URL: a.URL, StepTimeoutS: a.StepTimeoutS, Headers: redactHeaders(a.Headers),
		SigningSecretCreatedAt: a.SigningSecretCreatedAt, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt,
	}
}

// agentErr turns the agent service's errors into the API's.
func agentErr(err error) error {
	var inv *agentqtype.InvalidError
	var builtin *agents.BuiltinError
	var nf *agentqtype.NotFoundError
	switch {
	case errors.As(err, &inv):
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.As(err, &builtin):
		return apiErr(http.StatusConflict, CodeConflict, "%s", builtin.Error())
	case errors.As(err, &nf):
		return apiErr(http.StatusNotFound, CodeNotFound, "%s", nf.Message)
	}
	return err
}

func (s *Server) putAgent(c echo.Context) error {
	name := c.Param("name")
	// The name is judged before the body is read: a bad name is the answer whatever
	// the body holds.
	if err := s.HTTPAgents.CheckName(name); err != nil {
		return agentErr(err)
	}
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r AgentRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	put, err := s.HTTPAgents.Put(c.Request().Context(), agents.PutParams{
		Name: name, URL: r.URL, StepTimeoutS: r.StepTimeoutS, Headers: r.Headers,
	})
	if err != nil {
		return agentErr(err)
	}
	if put.Created {
		return c.JSON(http.StatusCreated, AgentWithSecret{AgentJSON: agentJSON(put.Agent), SigningSecret: put.SigningSecret})
	}
	return c.JSON(http.StatusOK, agentJSON(put.Agent))
}

// rotateAgentSecret gives an agent a new signing secret and shows it once.
func (s *Server) rotateAgentSecret(c echo.Context) error {
	a, secret, err := s.HTTPAgents.RotateSecret(c.Request().Context(), c.Param("name"))
	if err != nil {
		return agentErr(err)
	}
	return c.JSON(http.StatusOK, AgentWithSecret{AgentJSON: agentJSON(a), SigningSecret: secret})
}

// redactHeaders hides header values (they often hold the agent's credentials).
func redactHeaders(h map[string]string) map[string]string {
	out := make(map[string]string, len(h))
	for k := range h {
		out[k] = "********"
	}
	return out
}

func (s *Server) getAgent(c echo.Context) error {
	a, err := s.HTTPAgents.Get(c.Request().Context(), c.Param("name"))
	if err != nil {
		return agentErr(err)
	}
	return c.JSON(http.StatusOK, agentJSON(a))
}

func (s *Server) listAgents(c echo.Context) error {
	as, err := s.HTTPAgents.List(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]AgentJSON, 0, len(as))
	for _, a := range as {
		out = append(out, agentJSON(a))
	}
	return c.JSON(http.StatusOK, map[string]any{"agents": out})
}

func (s *Server) deleteAgent(c echo.Context) error {
	if err := s.HTTPAgents.Delete(c.Request().Context(), c.Param("name")); err != nil {
		return agentErr(err)
	}
	return c.NoContent(http.StatusNoContent)
}
