package api

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

//go:embed openapi.json
var openapiDoc []byte

// OpenAPI returns the embedded OpenAPI 3.1 document of the HTTP API.
func OpenAPI() []byte { return openapiDoc }

func (s *API) openapi(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/json", openapiDoc)
}
