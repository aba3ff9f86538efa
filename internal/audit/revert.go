package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Revertible is what a revert can undo, in the words of its refusal.
const Revertible = "a revert undoes changes to tenants (plan, overrides, weight, status, billing anchor, name), " +
	"pools, agent bindings, agents' URL and step timeout, and webhook endpoints' enablement"

// NotRevertibleError is a row a revert cannot undo: its action changes nothing a
// revert restores (a key, a secret, a link, a task's budget), or it made an object a
// revert would have to delete with its secrets.
type NotRevertibleError struct {
	ID     int64
	Action string
	Why    string // "" for the general rule (Revertible)
}

func (e *NotRevertibleError) Error() string {
	why := e.Why
	if why == "" {
		why = Revertible
	}
	return fmt.Sprintf("Audit row %d (%s) cannot be reverted: %s.", e.ID, e.Action, why)
}

func notRevertible(r Row, why string) *NotRevertibleError {
	return &NotRevertibleError{ID: r.ID, Action: r.Action, Why: why}
}

// NotRevertible is the refusal of row r, for why ("" for the general rule).
func NotRevertible(r Row, why string) error { return notRevertible(r, why) }

// ConflictError is a revert refused because its object changed since the row: it no
// longer matches the row's after.
type ConflictError struct {
	ID     int64
	Object Object
	// Changed are the fields that differ from the row's after; Existence says the
	// object was "deleted" or "created" since instead.
	Changed   []string
	Existence string
}

func (e *ConflictError) Error() string {
	what := e.Object.Kind + " " + e.Object.ID
	if e.Existence != "" {
		return fmt.Sprintf("Audit row %d cannot be reverted: %s was %s since. Revert the later rows first, or change it directly.",
			e.ID, what, e.Existence)
	}
	return fmt.Sprintf("Audit row %d cannot be reverted: %s changed since (%s). Revert the later rows first, or change it directly.",
		e.ID, what, strings.Join(e.Changed, ", "))
}

// Check refuses the revert of r (a *ConflictError) unless current, the object's
// state now (nil: it does not exist), is r's After.
func Check(r Row, current any) error {
	cur, err := stateJSON(current)
	if err != nil {
		return err
	}
	c := &ConflictError{ID: r.ID, Object: r.Object}
	curNull, afterNull := cur == nil, isNull(r.After)
	switch {
	case curNull && afterNull:
		return nil
	case curNull:
		c.Existence = "deleted"
		return c
	case afterNull:
		c.Existence = "created"
		return c
	}
	changes, err := Diff(r.After, cur)
	if err != nil {
		return err
	}
	for _, ch := range changes {
		c.Changed = append(c.Changed, ch.Field)
	}
	if len(c.Changed) == 0 {
		return nil
	}
	return c
}

// RevertOf is the entry of the revert of r: its object from current (r's After) back
// to restored.
func RevertOf(r Row, current, restored any) Entry {
	return Entry{Action: r.Object.Kind + ".revert", Object: r.Object, Before: current, After: restored, Reverts: r.ID}
}

// Decode reads a state of a row into a T; nil for null.
func Decode[T any](raw json.RawMessage) (*T, error) {
	if isNull(raw) {
		return nil, nil
	}
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("audit: state: %w", err)
	}
	return &v, nil
}

func isNull(b json.RawMessage) bool {
	t := bytes.TrimSpace(b)
	return len(t) == 0 || string(t) == "null"
}

// FieldChange is one top-level field of a state that a change moved.
type FieldChange struct {
	Field         string
	Before, After json.RawMessage // canonical JSON; null when absent
}

// Diff lists the top-level fields whose values differ between two states (objects,
// or null), by field name.
func Diff(before, after json.RawMessage) ([]FieldChange, error) {
	b, err := fields(before)
	if err != nil {
		return nil, err
	}
	a, err := fields(after)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for k := range b {
		names[k] = true
	}
	for k := range a {
		names[k] = true
	}
	var out []FieldChange
	for k := range names {
		bv, av := orNullRaw(b[k]), orNullRaw(a[k])
		if !bytes.Equal(bv, av) {
			out = append(out, FieldChange{Field: k, Before: bv, After: av})
		}
	}
	slices.SortFunc(out, func(x, y FieldChange) int { return strings.Compare(x.Field, y.Field) })
	return out, nil
}

// fields are a state's top-level fields, each in canonical JSON.
func fields(raw json.RawMessage) (map[string]json.RawMessage, error) {
	if isNull(raw) {
		return nil, nil
	}
	c, err := Canonical(raw)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(c, &m); err != nil {
		return nil, fmt.Errorf("audit: state is not an object: %w", err)
	}
	return m, nil
}

func orNullRaw(b json.RawMessage) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return b
}
