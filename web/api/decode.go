package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// maxBodyBytes bounds every request body.
const maxBodyBytes = 1 << 20

// readBody reads the request body, at most maxBodyBytes.
func readBody(c echo.Context) ([]byte, error) {
	r := c.Request()
	if r.ContentLength > maxBodyBytes {
		return nil, tooLarge()
	}
	b, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, maxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, Errorf(http.StatusBadRequest, CodeInvalidRequest, "Could not read the request body.")
	}
	return b, nil
}

// decodeStrict decodes one JSON value into dst, refusing unknown fields, trailing data
// and text Postgres would refuse (checkJSONText). An empty body decodes as {} when
// allowEmpty.
func decodeStrict(body []byte, dst any, allowEmpty bool) error {
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return Errorf(http.StatusBadRequest, CodeInvalidJSON, "The request body is empty; send a JSON object.")
	}
	if err := checkJSONText(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return Errorf(http.StatusBadRequest, CodeInvalidJSON, "The request body holds more than one JSON value.")
	}
	if _, err := dec.Token(); err != io.EOF {
		return Errorf(http.StatusBadRequest, CodeInvalidJSON, "The request body holds data after the JSON value.")
	}
	return nil
}

func jsonError(err error) *APIError {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "json: unknown field "):
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Unknown field %s.", strings.TrimPrefix(msg, "json: unknown field "))
	case errors.As(err, &syn):
		return Errorf(http.StatusBadRequest, CodeInvalidJSON, "Malformed JSON at byte %d: %s.", syn.Offset, syn.Error())
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "the body"
		}
		return Errorf(http.StatusBadRequest, CodeInvalidRequest, "Field %s must be %s, not %s.", field, typ.Type.String(), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return Errorf(http.StatusBadRequest, CodeInvalidJSON, "Malformed JSON: the body ends early.")
	default:
		return Errorf(http.StatusBadRequest, CodeInvalidJSON, "Malformed JSON: %s.", msg)
	}
}
