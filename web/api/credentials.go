package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/credentials"
)

// CredentialRequest is the body of POST /v1/admin/credentials.
type CredentialRequest struct {
	Name *string `json:"name"`
	Role *string `json:"role"`
}

// CredentialJSON is an admin credential as listings show it: never its token. Source
// is where it is defined: "bootstrap" (AGENTQ_ADMIN_TOKEN), "env"
// (AGENTQ_ADMIN_TOKENS) or "stored"; only stored ones have times.
type CredentialJSON struct {
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	Source    string     `json:"source"`
	CreatedAt *time.Time `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// CredentialCreated is the answer to creation and rotation: the token is shown once.
type CredentialCreated struct {
	CredentialJSON
	Token string `json:"token"`
}

// NewCredentialJSON is c as the API lists it (the CLI prints the same shape).
func NewCredentialJSON(c credentials.Credential) CredentialJSON {
	return CredentialJSON{Name: c.Name, Role: string(c.Role), Source: string(c.Source),
		CreatedAt: c.CreatedAt, RotatedAt: c.RotatedAt, RevokedAt: c.RevokedAt}
}

// NewCredentialCreated is a created or rotated credential with its token.
func NewCredentialCreated(c credentials.Created) CredentialCreated {
	return CredentialCreated{CredentialJSON: NewCredentialJSON(c.Credential), Token: c.Token}
}

// credentialErr turns the credential service's errors into the API's.
func credentialErr(err error) error {
	var inv *agentqtype.InvalidError
	var nf *agentqtype.NotFoundError
	var conflict *credentials.ConflictError
	switch {
	case errors.As(err, &inv):
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s", inv.Message)
	case errors.As(err, &nf):
		return Errorf(http.StatusNotFound, CodeNotFound, "%s", nf.Message)
	case errors.As(err, &conflict):
		return Errorf(http.StatusConflict, CodeConflict, "%s", conflict.Message)
	}
	return err
}

func (s *API) createCredential(c echo.Context) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	var r CredentialRequest
	if err := decodeStrict(body, &r, false); err != nil {
		return err
	}
	if r.Name == nil || r.Role == nil {
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Fields name and role are required.")
	}
	cr, err := s.Credentials.Create(c.Request().Context(), credentials.CreateParams{Name: *r.Name, Role: agentqtype.Role(*r.Role)})
	if err != nil {
		return credentialErr(err)
	}
	return c.JSON(http.StatusCreated, NewCredentialCreated(cr))
}

func (s *API) listCredentials(c echo.Context) error {
	cs, err := s.Credentials.List(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]CredentialJSON, 0, len(cs))
	for _, cr := range cs {
		out = append(out, NewCredentialJSON(cr))
	}
	return c.JSON(http.StatusOK, map[string]any{"credentials": out})
}

func (s *API) rotateCredential(c echo.Context) error {
	cr, err := s.Credentials.Rotate(c.Request().Context(), credentials.RotateParams{Name: c.Param("name")})
	if err != nil {
		return credentialErr(err)
	}
	return c.JSON(http.StatusOK, NewCredentialCreated(cr))
}

func (s *API) revokeCredential(c echo.Context) error {
	if _, err := s.Credentials.Revoke(c.Request().Context(), credentials.RevokeParams{Name: c.Param("name")}); err != nil {
		return credentialErr(err)
	}
	return c.NoContent(http.StatusNoContent)
}
