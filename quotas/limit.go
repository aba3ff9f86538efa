package quotas

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Limit is one limit's value in the plan catalogue and in a tenant's overrides: a
// number is the limit itself (0 allows nothing) and Unlimited turns the limit off.
// It reads and writes a number or the string "unlimited", in YAML and in JSON.
type Limit float64

// Unlimited turns a limit off. Inside (Limits and the scripts) it is -1, and a limit
// is on when it is >= 0.
const Unlimited Limit = -1

const unlimitedText = "unlimited"

// Off reports whether the limit is switched off.
func (l Limit) Off() bool { return l < 0 }

// String is the number, or "unlimited".
func (l Limit) String() string {
	if l.Off() {
		return unlimitedText
	}
	return strconv.FormatFloat(float64(l), 'f', -1, 64)
}

// MarshalJSON writes the number, or "unlimited".
func (l Limit) MarshalJSON() ([]byte, error) {
	if l.Off() {
		return []byte(`"` + unlimitedText + `"`), nil
	}
	return json.Marshal(float64(l))
}

var errLimitValue = errors.New(`a limit is a number >= 0 or "unlimited"`)

// UnmarshalJSON reads a number >= 0 or "unlimited".
func (l *Limit) UnmarshalJSON(b []byte) error {
	// A number, as nearly every stored limit is, is parsed directly: a tenant's
	// overrides are decoded on every read of its row (each batch of step ends reads
	// its tenants), and two trial decodes per value were a visible part of that. The
	// JSON decoder has validated b, so a value of number characters only is a JSON
	// number, which strconv reads as json itself does; anything else takes the path
	// below.
	if numberChars(b) {
		if f, err := strconv.ParseFloat(string(b), 64); err == nil {
			return l.setNumber(f)
		}
	}
	return l.unmarshalAnyJSON(b)
}

// unmarshalAnyJSON decodes any JSON value as a limit: "unlimited", or a number.
func (l *Limit) unmarshalAnyJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		if s != unlimitedText {
			return fmt.Errorf("%w, not %q", errLimitValue, s)
		}
		*l = Unlimited
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("%w, not %s", errLimitValue, b)
	}
	return l.setNumber(f)
}

// numberChars reports whether b holds only the characters of a JSON number.
func numberChars(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && c != '-' && c != '+' && c != '.' && c != 'e' && c != 'E' {
			return false
		}
	}
	return true
}

// MarshalYAML writes the number, or unlimited.
func (l Limit) MarshalYAML() (any, error) {
	if l.Off() {
		return unlimitedText, nil
	}
	return float64(l), nil
}

// UnmarshalYAML reads a number >= 0 or unlimited.
func (l *Limit) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == unlimitedText {
		*l = Unlimited
		return nil
	}
	var f float64
	if err := n.Decode(&f); err != nil {
		return fmt.Errorf("line %d: %w, not %q", n.Line, errLimitValue, n.Value)
	}
	return l.setNumber(f)
}

func (l *Limit) setNumber(f float64) error {
	if f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("%w, not %v", errLimitValue, f)
	}
	*l = Limit(f)
	return nil
}

// lookup returns a limit of an effective map; a limit the map lacks is off.
func lookup(m map[string]Limit, name string) Limit {
	if v, ok := m[name]; ok {
		return v
	}
	return Unlimited
}
