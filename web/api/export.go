package api

import (
	"bytes"
	"errors"
	"mime"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/agentq/agentq/billing/usage"
)

// MIMETextCSV is the CSV export's content type.
const MIMETextCSV = "text/csv; charset=utf-8"

// wantsCSV reports whether an Accept header asks for text/csv (and not JSON first).
func wantsCSV(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch strings.ToLower(mt) {
		case "text/csv":
			return true
		case "application/json":
			return false
		}
	}
	return false
}

// adminUsage is GET /v1/admin/usage?period=YYYY-MM[&format=csv|json]: every tenant's
// use in its billing period that starts in that month, per meter, as JSON or (format=csv
// or Accept: text/csv) CSV.
func (s *API) adminUsage(c echo.Context) error {
	q := c.QueryParams()
	for k := range q {
		if k != "period" && k != "format" {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown query parameter %q.", k)
		}
	}
	format := q.Get("format")
	switch format {
	case "json", "csv":
	case "":
		format = "json"
		if wantsCSV(c.Request().Header.Get(echo.HeaderAccept)) {
			format = "csv"
		}
	default:
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "format must be json or csv.")
	}
	if q.Get("period") == "" {
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s", usage.BadPeriodMessage)
	}
	src := s.UsageExport
	if src == nil {
		src = s.Usage
	}
	exp, err := src.Export(c.Request().Context(), q.Get("period"))
	if errors.Is(err, usage.ErrBadPeriod) {
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "%s", usage.BadPeriodMessage)
	}
	if err != nil {
		return err
	}
	if format == "json" {
		return c.JSON(http.StatusOK, exp)
	}
	var b bytes.Buffer
	if err := usage.WriteCSV(&b, exp); err != nil {
		return err
	}
	c.Response().Header().Set("Content-Disposition", `attachment; filename="usage-`+exp.Month+`.csv"`)
	return c.Blob(http.StatusOK, MIMETextCSV, b.Bytes())
}
