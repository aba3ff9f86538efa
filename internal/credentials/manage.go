package credentials

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/store"
)

// CreateParams are a new stored credential's name and role.
type CreateParams struct {
	Name string
	Role agentqtype.Role
}

// Create stores a new credential with a fresh token, returned once. A refused name or
// role is an *agentqtype.InvalidError; a name taken (by a stored credential, ever, or
// by one of the environment) a *ConflictError.
func (s *Service) Create(ctx context.Context, p CreateParams) (Created, error) {
	if !agentqtype.ValidCredentialName(p.Name) {
		return Created{}, agentqtype.Invalid("name", "Field name must be 1 to 63 lower-case letters, digits, '.', '-' or '_', starting with a letter or digit.")
	}
	if !p.Role.Valid() {
		return Created{}, agentqtype.Invalid("role", "Field role must be one of admin, operator, finance, viewer.")
	}
	if s.envNamed(p.Name) {
		return Created{}, fromEnv(p.Name)
	}
	if p.Name == agentqtype.BootstrapCredential {
		return Created{}, &ConflictError{Name: p.Name, FromEnv: true,
			Message: `The name "admin" is kept for AGENTQ_ADMIN_TOKEN's credential; choose another.`}
	}
	if s.store == nil {
		return Created{}, errors.New("credentials: no store to keep credentials in")
	}
	token, hash := newToken()
	var c store.AdminCredential
	err := s.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		if c, err = tx.CreateCredential(ctx, store.CreateCredentialParams{Name: p.Name, Role: p.Role, TokenHash: hash}); err != nil {
			return err
		}
		return record(ctx, tx, "credential.create", nil, &c)
	})
	if errors.Is(err, store.ErrConflict) {
		return Created{}, &ConflictError{Name: p.Name, Message: fmt.Sprintf(
			"Credential %q already exists; a name is never reused, even once revoked.", p.Name)}
	}
	if err != nil {
		return Created{}, err
	}
	s.changed(ctx, p.Name)
	return Created{Credential: stored(c), Token: token}, nil
}

func (s *Service) envNamed(name string) bool {
	for _, e := range s.env {
		if e.cred.Name == name {
			return true
		}
	}
	return false
}

// List returns every credential, never a token: the environment's first (the
// bootstrap one, then AGENTQ_ADMIN_TOKENS in order), then the stored ones by name,
// revoked ones included.
func (s *Service) List(ctx context.Context) ([]Credential, error) {
	out := make([]Credential, 0, len(s.env))
	for _, e := range s.env {
		out = append(out, e.cred)
	}
	if s.store == nil {
		return out, nil
	}
	cs, err := s.store.ListCredentials(ctx, store.ListCredentialsParams{})
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		out = append(out, stored(c))
	}
	return out, nil
}

// RotateParams name the stored credential to give a new token.
type RotateParams struct {
	Name string
}

// Rotate gives a live stored credential a new token, returned once; the old one
// stops working, and the credential's operator view sessions end. A credential of the
// environment is a *ConflictError; no live one by the name a *agentqtype.NotFoundError.
func (s *Service) Rotate(ctx context.Context, p RotateParams) (Created, error) {
	if err := s.storedOnly(p.Name); err != nil {
		return Created{}, err
	}
	token, hash := newToken()
	c, err := s.change(ctx, p.Name, "credential.rotate", func(tx *store.Store) (store.AdminCredential, error) {
		return tx.RotateCredential(ctx, store.RotateCredentialParams{Name: p.Name, TokenHash: hash})
	})
	if err != nil {
		return Created{}, s.manageErr(err, p.Name)
	}
	s.changed(ctx, p.Name)
	return Created{Credential: stored(c), Token: token}, nil
}

// RevokeParams name the stored credential to revoke.
type RevokeParams struct {
	Name string
}

// Revoke revokes a live stored credential: its token stops working and its operator
// view sessions end. It returns the credential as revoked. Errors as Rotate's.
func (s *Service) Revoke(ctx context.Context, p RevokeParams) (Credential, error) {
	if err := s.storedOnly(p.Name); err != nil {
		return Credential{}, err
	}
	c, err := s.change(ctx, p.Name, "credential.revoke", func(tx *store.Store) (store.AdminCredential, error) {
		return tx.RevokeCredential(ctx, store.RevokeCredentialParams{Name: p.Name})
	})
	if err != nil {
		return Credential{}, s.manageErr(err, p.Name)
	}
	s.changed(ctx, p.Name)
	return stored(c), nil
}

// storedOnly refuses what names no stored credential before anything is written.
func (s *Service) storedOnly(name string) error {
	if !agentqtype.ValidCredentialName(name) {
		return noLive(name)
	}
	if s.store == nil {
		if s.envNamed(name) {
			return fromEnv(name)
		}
		return noLive(name)
	}
	return nil
}

// manageErr names what a rotation or revocation found missing: a name only the
// environment defines is a conflict (a stored one of the same name comes first).
func (s *Service) manageErr(err error, name string) error {
	if !errors.Is(err, agentqtype.ErrNotFound) {
		return err
	}
	if s.envNamed(name) {
		return fromEnv(name)
	}
	return noLive(name)
}

// change makes write's change of stored credential name with its audit row, in one
// transaction.
func (s *Service) change(ctx context.Context, name, action string, write func(tx *store.Store) (store.AdminCredential, error)) (store.AdminCredential, error) {
	var c store.AdminCredential
	err := s.store.InTx(ctx, func(tx *store.Store) error {
		old, err := tx.GetCredential(ctx, store.GetCredentialParams{Name: name})
		if err != nil {
			return err
		}
		if c, err = write(tx); err != nil {
			return err
		}
		return record(ctx, tx, action, &old, &c)
	})
	return c, err
}

// record appends the audit row of a credential's change from before to after (nil:
// none), its token masked.
func record(ctx context.Context, tx *store.Store, action string, before, after *store.AdminCredential) error {
	e := audit.Entry{Action: action}
	if before != nil {
		e.Before, e.Object = audit.Credential(*before), audit.Object{Kind: audit.KindCredential, ID: before.Name}
	}
	if after != nil {
		e.After, e.Object = audit.Credential(*after), audit.Object{Kind: audit.KindCredential, ID: after.Name}
	}
	_, err := audit.Append(ctx, tx, e)
	return err
}
