// Package keys is the API-key domain service: creating a tenant's keys with their
// scopes, listing, rotating and revoking them. The admin API and `agentq admin` both go
// through it, so they refuse the same requests with the same sentences, and a rotated or
// revoked key is dropped from the servers' caches (and a revoked key's limit state from
// Redis) whichever of them changed it.
package keys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
)

// Key is a stored API key (never its secret's plaintext).
type Key = store.APIKey

// Scopes limit what a key may do: the agents it may run and the users it may act for;
// an empty list allows all.
type Scopes = store.Scopes

// ErrInvalidKey is Authenticate's answer for an unknown, revoked, malformed or wrong
// key; it never says which.
var ErrInvalidKey = apikey.ErrInvalid

// noTenant is a tenant that does not exist.
func noTenant(id string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "tenant", Name: id, Message: fmt.Sprintf("No tenant %q.", id)}
}

// noLiveKey is a kid with no live key.
func noLiveKey(kid string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "key", Name: kid, Message: fmt.Sprintf("No live key %q.", kid)}
}

// Invalidator tells the other processes' key caches that a key changed (its secret
// was replaced, or it was revoked), so they stop honouring the old state at once
// rather than when their cache entry expires. The service drops its own entry itself.
type Invalidator interface {
	InvalidateKey(ctx context.Context, kid string) error
}

// LimitState drops a key's live limit state (its rate windows) from Redis.
type LimitState interface {
	DropKey(ctx context.Context, tenantID, kid string) error
}

// Options are a Service's optional collaborators. Without them the changes are still
// written; servers then see them when their cache entries expire (within a second) and
// a revoked key's limit state expires on its own.
type Options struct {
	Invalidator Invalidator
	Limits      LimitState
	// Archetype is where the service logs; nil: the defaults.
	Archetype *baseservice.Archetype
	// CacheTTL bounds how long Authenticate trusts a cached key (default 1s): a change
	// whose invalidation message is lost still reaches every process within it.
	CacheTTL time.Duration
}

// DefaultCacheTTL is Options.CacheTTL's default.
const DefaultCacheTTL = time.Second

// cacheSize bounds the cached keys, however many kids are presented.
const cacheSize = 10000

// Service authenticates, creates, lists, rotates and revokes API keys.
type Service struct {
	store  *store.Store
	inval  Invalidator
	limits LimitState
	log    *slog.Logger
	cache  *apikey.Cache
}

// New returns a Service over st.
func New(st *store.Store, o Options) *Service {
	s := &Service{store: st, inval: o.Invalidator, limits: o.Limits, log: o.Archetype.Defaults().Logger}
	ttl := o.CacheTTL
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	s.cache = apikey.NewCache(s.load, cacheSize, ttl)
	return s
}

// Authenticate verifies a plaintext key ("aq_<kid>_<secret>") and returns what the
// key may do. Keys are read through a cache of the service's own; a key that is
// unknown, revoked, malformed or wrong is ErrInvalidKey. Any other error is a
// failure to look the key up.
func (s *Service) Authenticate(ctx context.Context, plaintext string) (apikey.Record, error) {
	return s.cache.Authenticate(ctx, plaintext)
}

// Forget drops kid from the authentication cache (another process changed it).
func (s *Service) Forget(kid string) { s.cache.Invalidate(kid) }

// ForgetAll empties the authentication cache, so that every key is read again.
func (s *Service) ForgetAll() { s.cache.Purge() }

func (s *Service) load(ctx context.Context, kid string) (apikey.Record, bool, error) {
	k, err := s.store.UnscopedGetKey(ctx, kid)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return apikey.Record{}, false, nil
	}
	if err != nil {
		return apikey.Record{}, false, err
	}
	return apikey.Record{
		Kid: k.Kid, TenantID: k.TenantID, SecretHash: k.SecretHash, Revoked: k.RevokedAt != nil,
		Agents: k.Scopes.Agents, Principals: k.Scopes.Principals,
	}, true, nil
}

// MaxScopeEntry is the longest scope entry, in bytes.
const MaxScopeEntry = 255

// Created is a new or rotated key with its plaintext, which is shown once and never
// stored.
type Created struct {
	Key
	Plaintext string
}

// CreateParams are a new key's fields.
type CreateParams struct {
	TenantID string
	Scopes   Scopes // empty lists mean "all"
}

// Create validates p and stores a new key for the tenant. A refused scope is an
// *agentqtype.InvalidError; a missing tenant a *agentqtype.NotFoundError.
func (s *Service) Create(ctx context.Context, p CreateParams) (Created, error) {
	if err := ValidateScopes(p.Scopes); err != nil {
		return Created{}, err
	}
	kid, plaintext, hash := apikey.New(p.TenantID)
	var k Key
	err := s.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		if k, err = tx.CreateKey(ctx, store.CreateKeyParams{Kid: kid, TenantID: p.TenantID, SecretHash: hash, Scopes: p.Scopes}); err != nil {
			return err
		}
		return record(ctx, tx, "key.create", nil, &k)
	})
	if errors.Is(err, agentqtype.ErrNotFound) || errors.Is(err, store.ErrNoTenant) {
		return Created{}, noTenant(p.TenantID)
	}
	if err != nil {
		return Created{}, err
	}
	return Created{Key: k, Plaintext: plaintext}, nil
}

// List returns a tenant's keys, revoked ones included, oldest first (never nil). A
// missing tenant is a *agentqtype.NotFoundError.
func (s *Service) List(ctx context.Context, tenantID string) ([]Key, error) {
	if _, err := s.store.GetTenant(ctx, tenantID); errors.Is(err, agentqtype.ErrNotFound) || errors.Is(err, store.ErrNoTenant) {
		return nil, noTenant(tenantID)
	} else if err != nil {
		return nil, err
	}
	ks, err := s.store.ListKeys(ctx, store.ListKeysParams{TenantID: tenantID})
	if err != nil {
		return nil, err
	}
	if ks == nil {
		ks = []Key{}
	}
	return ks, nil
}

// Rotate gives live key kid a new secret; the old one stops working. A kid with no
// live key is a *agentqtype.NotFoundError.
func (s *Service) Rotate(ctx context.Context, kid string) (Created, error) {
	if !apikey.ValidKid(kid) {
		return Created{}, noLiveKey(kid)
	}
	// The kid alone names the key; its tenant scopes the write.
	k, err := s.store.UnscopedGetKey(ctx, kid)
	if errors.Is(err, agentqtype.ErrNotFound) || (err == nil && k.RevokedAt != nil) {
		return Created{}, noLiveKey(kid)
	}
	if err != nil {
		return Created{}, err
	}
	plaintext, hash := apikey.NewSecret(kid)
	old := k
	err = s.store.InTx(ctx, func(tx *store.Store) error {
		var err error
		if k, err = tx.RotateKey(ctx, store.RotateKeyParams{TenantID: k.TenantID, Kid: kid, SecretHash: hash}); err != nil {
			return err
		}
		return record(ctx, tx, "key.rotate", &old, &k)
	})
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Created{}, noLiveKey(kid)
	}
	if err != nil {
		return Created{}, err
	}
	s.invalidate(ctx, kid)
	return Created{Key: k, Plaintext: plaintext}, nil
}

// Revoke revokes live key kid and drops its limit state (keys that remain keep
// theirs). A kid with no live key is a *agentqtype.NotFoundError. It returns the key
// as it was before revocation.
func (s *Service) Revoke(ctx context.Context, kid string) (Key, error) {
	if !apikey.ValidKid(kid) {
		return Key{}, noLiveKey(kid)
	}
	k, err := s.store.UnscopedGetKey(ctx, kid)
	if err == nil && k.RevokedAt == nil {
		err = s.revoke(ctx, k)
	} else if err == nil {
		err = agentqtype.ErrNotFound
	}
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Key{}, noLiveKey(kid)
	}
	if err != nil {
		return Key{}, err
	}
	s.invalidate(ctx, kid)
	if s.limits != nil {
		if err := s.limits.DropKey(ctx, k.TenantID, kid); err != nil {
			s.log.Warn("dropping a revoked key's limit state failed; it expires on its own", "kid", kid, "err", err)
		}
	}
	return k, nil
}

// revoke revokes live key k with its audit row.
func (s *Service) revoke(ctx context.Context, k Key) error {
	return s.store.InTx(ctx, func(tx *store.Store) error {
		if err := tx.RevokeKey(ctx, store.RevokeKeyParams{TenantID: k.TenantID, Kid: k.Kid}); err != nil {
			return err
		}
		after, err := tx.UnscopedGetKey(ctx, k.Kid)
		if err != nil {
			return err
		}
		return record(ctx, tx, "key.revoke", &k, &after)
	})
}

// record appends the audit row of a key's change from before to after (nil: none);
// the key's secret is masked there.
func record(ctx context.Context, tx *store.Store, action string, before, after *Key) error {
	e := audit.Entry{Action: action}
	if before != nil {
		e.Before = audit.Key(*before)
	}
	if after != nil {
		e.After = audit.Key(*after)
		e.Object = audit.Object{Kind: audit.KindKey, ID: after.Kid, Tenant: after.TenantID}
	}
	_, err := audit.Append(ctx, tx, e)
	return err
}

func (s *Service) invalidate(ctx context.Context, kid string) {
	s.cache.Invalidate(kid)
	if s.inval == nil {
		return
	}
	if err := s.inval.InvalidateKey(ctx, kid); err != nil {
		s.log.Warn("invalidating a changed key failed; servers catch up within the cache TTL", "kid", kid, "err", err)
	}
}

// ValidateScopes refuses scope entries that are empty, longer than MaxScopeEntry bytes,
// not valid UTF-8 or carrying a control character.
func ValidateScopes(sc Scopes) error {
	for _, lists := range [][]string{sc.Agents, sc.Principals} {
		for _, a := range lists {
			if a == "" || len(a) > MaxScopeEntry || !utf8.ValidString(a) || strings.ContainsFunc(a, isControl) {
				return &agentqtype.InvalidError{Field: "scopes", Message: "Scope entries must be 1 to 255 bytes without control characters."}
			}
		}
	}
	return nil
}

// isControl tells the C0 controls, DEL and the C1 controls (the API's rule for
// identifiers).
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }
