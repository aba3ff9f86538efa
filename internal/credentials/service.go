package credentials

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/store"
)

// Authenticate resolves a presented token to its live credential: the environment's
// (compared in constant time, every one of them), else a stored one by its hash.
// A token that resolves to none is ErrInvalid; any other error is a failed lookup.
func (s *Service) Authenticate(ctx context.Context, token string) (Credential, error) {
	if token == "" || len(token) > MaxTokenBytes {
		return Credential{}, ErrInvalid
	}
	got := hmacOf(s.macKey, token)
	var match *envCred
	for i := range s.env {
		// No early exit: the time taken does not tell which one matched.
		if subtle.ConstantTimeCompare(s.env[i].mac, got) == 1 && match == nil {
			match = &s.env[i]
		}
	}
	if match != nil {
		return match.cred, nil
	}
	if s.store == nil || !storedShape(token) {
		return Credential{}, ErrInvalid
	}
	hash := apikey.Hash(token)
	return s.cachedLive(ctx, s.byHash, hex.EncodeToString(hash), func() (store.AdminCredential, error) {
		return s.store.CredentialByHash(ctx, store.CredentialByHashParams{TokenHash: hash})
	})
}

// Lookup is the live credential called name (the operator view checks its sessions
// with it); ErrInvalid when there is none.
func (s *Service) Lookup(ctx context.Context, name string) (Credential, error) {
	for _, e := range s.env {
		if e.cred.Name == name {
			return e.cred, nil
		}
	}
	if s.store == nil || !agentqtype.ValidCredentialName(name) {
		return Credential{}, ErrInvalid
	}
	return s.cachedLive(ctx, s.byName, name, func() (store.AdminCredential, error) {
		return s.store.GetCredential(ctx, store.GetCredentialParams{Name: name})
	})
}

// cachedLive reads a stored credential through cache c, and answers it when it is
// live.
func (s *Service) cachedLive(ctx context.Context, c interface {
	Get(string) (cached, bool)
	Add(string, cached) bool
}, key string, load func() (store.AdminCredential, error)) (Credential, error) {
	e, ok := c.Get(key)
	if !ok {
		sc, err := load()
		switch {
		case errors.Is(err, agentqtype.ErrNotFound):
			e = cached{}
		case err != nil:
			return Credential{}, fmt.Errorf("credentials: lookup: %w", err)
		default:
			e = cached{cred: stored(sc), found: true}
		}
		c.Add(key, e)
	}
	if !e.found || e.cred.RevokedAt != nil {
		return Credential{}, ErrInvalid
	}
	return e.cred, nil
}

// Configured reports whether any credential exists: one in the environment, or a live
// stored one. Without any the admin API and the operator view are off.
func (s *Service) Configured(ctx context.Context) (bool, error) {
	if len(s.env) > 0 {
		return true, nil
	}
	if s.store == nil {
		return false, nil
	}
	if v, ok := s.live.Get(""); ok {
		return v, nil
	}
	v, err := s.store.AnyLiveCredential(ctx, store.AnyLiveCredentialParams{})
	if err != nil {
		return false, fmt.Errorf("credentials: %w", err)
	}
	s.live.Add("", v)
	return v, nil
}

func stored(c store.AdminCredential) Credential {
	created := c.CreatedAt
	return Credential{Name: c.Name, Role: c.Role, Source: SourceStored, CreatedAt: &created,
		RotatedAt: c.RotatedAt, RevokedAt: c.RevokedAt, secret: c.TokenHash}
}

// Forget empties the caches (another process changed a credential; SIGHUP).
func (s *Service) Forget() {
	s.byHash.Purge()
	s.byName.Purge()
	s.live.Purge()
}

// changed drops this process's cached lookups and tells the other processes.
func (s *Service) changed(ctx context.Context, name string) {
	s.Forget()
	if s.inval == nil {
		return
	}
	if err := s.inval.InvalidateCredential(ctx, name); err != nil {
		s.log.Warn("publishing a changed admin credential failed; other replicas catch up within a second", "credential", name, "err", err)
	}
}
