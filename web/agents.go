package web

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"regexp"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/internal/store"
)

var agentNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// AgentRequest is the body of PUT /v1/admin/agents/{name}.
type AgentRequest struct {
	URL          string            `json:"url"`
	StepTimeoutS *float64          `json:"step_timeout_s"`
	Headers      map[string]string `json:"headers"`
}

// reservedHeaders are set by the runtime on every step request.
var reservedHeaders = map[string]bool{
	"Content-Type": true, "Content-Length": true, "Host": true, "Traceparent": true, "Tracestate": true,
	"X-Agentq-Signature": true, "X-Agentq-Timestamp": true, "X-Agentq-Agent": true,
	"X-Agentq-Task-Id": true, "X-Agentq-Step": true, "X-Agentq-Attempt": true,
}

// AgentWithSecret is an agent as shown right after its signing secret was made (first
// registration, rotation): the only answers that ever carry the secret.
type AgentWithSecret struct {
	store.Agent
	SigningSecret string `json:"signing_secret"`
}

// newSigningSecret makes an agent's signing secret: 32 random bytes. Agents key their
// HMAC with the whole string as shown.
func newSigningSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("signing secret: %w", err)
	}
	return "aqsig_" + base64.RawURLEncoding.EncodeToString(b), nil
}

func (s *Server) putAgent(c echo.Context) error {
	name := c.Param("name")
	if !agentNameRE.MatchString(name) {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Agent names are 1 to 63 letters, digits, '.', '-' or '_'.")
	}
	if s.Agents.Local(name) {
		return apiErr(http.StatusConflict, CodeConflict, "Agent %q is built in or registered in process; pick another name.", name)
	}
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r AgentRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	if err := checkAgentURL(r.URL); err != nil {
		return err
	}
	u, err := url.Parse(r.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "url must be an absolute http or https URL.")
	}
	timeout := 30.0
	if r.StepTimeoutS != nil {
		timeout = *r.StepTimeoutS
	}
	if timeout <= 0 || timeout > 3600 {
		return apiErr(http.StatusBadRequest, CodeInvalidRequest, "step_timeout_s must be above 0 and at most 3600.")
	}
	for k, v := range r.Headers {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if !validAgentHeader(k, v) {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Header %q is not a valid HTTP header.", k)
		}
		if reservedHeaders[ck] {
			return apiErr(http.StatusBadRequest, CodeInvalidRequest, "Header %q is set by agentq and cannot be configured.", k)
		}
	}
	secret, err := newSigningSecret()
	if err != nil {
		return err
	}
	// The secret is only stored when this PUT creates the agent: replacing one keeps
	// the secret its agent verifies with (rotation is its own request).
	a, created, err := s.Store.PutAgent(c.Request().Context(), store.PutAgentParams{
		Name: name, URL: r.URL, StepTimeoutS: timeout, Headers: r.Headers, SigningSecret: secret,
	})
	if err != nil {
		return err
	}
	a.Headers = redactHeaders(a.Headers)
	if created {
		return c.JSON(http.StatusCreated, AgentWithSecret{Agent: a, SigningSecret: secret})
	}
	return c.JSON(http.StatusOK, a)
}

// rotateAgentSecret gives an agent a new signing secret and shows it once. Workers
// sign with it within a second (their agent cache); the old one stops verifying then.
func (s *Server) rotateAgentSecret(c echo.Context) error {
	secret, err := newSigningSecret()
	if err != nil {
		return err
	}
	a, err := s.Store.RotateAgentSecret(c.Request().Context(), c.Param("name"), secret)
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No HTTP agent %q.", c.Param("name"))
	}
	if err != nil {
		return err
	}
	a.Headers = redactHeaders(a.Headers)
	return c.JSON(http.StatusOK, AgentWithSecret{Agent: a, SigningSecret: secret})
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
	a, err := s.Store.GetAgent(c.Request().Context(), c.Param("name"))
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No HTTP agent %q.", c.Param("name"))
	}
	if err != nil {
		return err
	}
	a.Headers = redactHeaders(a.Headers)
	return c.JSON(http.StatusOK, a)
}

func (s *Server) listAgents(c echo.Context) error {
	as, err := s.Store.ListAgents(c.Request().Context())
	if err != nil {
		return err
	}
	for i := range as {
		as[i].Headers = redactHeaders(as[i].Headers)
	}
	return c.JSON(http.StatusOK, map[string]any{"agents": as})
}

func (s *Server) deleteAgent(c echo.Context) error {
	err := s.Store.DeleteAgent(c.Request().Context(), c.Param("name"))
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, CodeNotFound, "No HTTP agent %q.", c.Param("name"))
	}
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
