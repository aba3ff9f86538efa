// Package credentials is the admin-credential domain service: the named credentials,
// each with a role, that the admin API and the operator view's sign-in accept, and
// what a presented token resolves to.
//
// Three sources, looked at in this order: the bootstrap credential (AGENTQ_ADMIN_TOKEN,
// named "admin", role admin), those of the environment (AGENTQ_ADMIN_TOKENS), and those
// stored in Postgres (created, rotated and revoked through the admin API or `agentq
// admin credentials`). The first two are compared in constant time; a stored token is
// 32 random bytes, "aqadm_" + 64 hex, kept as its SHA-256 only (as API keys are: with
// 256 bits of entropy a fast hash is right) and found by that hash.
//
// Stored lookups are cached in process for at most CacheTTL (1 s), found or not. A
// change made here drops this process's entries at once and is published on the
// cache-invalidation channel, on which every API replica drops its own; should that
// message be lost, the TTL still ends a rotated or revoked token's use within a second
// on every replica.
package credentials

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/apikey"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/config"
	"github.com/agentq/agentq/internal/store"
)

// Source says where a credential is defined.
type Source string

// Sources of credentials.
const (
	SourceBootstrap Source = "bootstrap" // AGENTQ_ADMIN_TOKEN
	SourceEnv       Source = "env"       // AGENTQ_ADMIN_TOKENS
	SourceStored    Source = "stored"    // Postgres: the admin API, the CLI
)

// TokenPrefix starts every stored credential's token.
const TokenPrefix = "aqadm_"

// MaxTokenBytes bounds a presented token: a longer one is wrong without being compared.
const MaxTokenBytes = 4096

const tokenBytes = 32

// ErrInvalid is Authenticate's and Lookup's answer for a token or name that resolves
// to no live credential; it never says why.
var ErrInvalid = errors.New("credentials: no such live admin credential")

// Credential is an admin credential: never its token.
type Credential struct {
	Name   string
	Role   agentqtype.Role
	Source Source
	// CreatedAt, RotatedAt and RevokedAt are a stored credential's (nil otherwise).
	CreatedAt *time.Time
	RotatedAt *time.Time
	RevokedAt *time.Time
	// secret is what the credential's session key is derived from: the token of one
	// defined in the environment, the stored hash of one in Postgres. Either changes
	// when the token does.
	secret []byte
}

// Actor is who acts with the credential.
func (c Credential) Actor() agentqtype.Actor {
	return agentqtype.Actor{Kind: agentqtype.ActorCredential, Name: c.Name, Role: c.Role}
}

// SessionKey is the key the operator view signs the credential's sessions with: it
// changes with the token, so rotating the credential ends its sessions (and revoking
// it leaves nothing to check them against).
func (c Credential) SessionKey() []byte {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("agentq operator session v1"))
	return m.Sum(nil)
}

// Created is a new or rotated credential with its token, which is shown once and
// never stored.
type Created struct {
	Credential
	Token string
}

// ConflictError refuses a name that is taken: by a stored credential (names are never
// reused), or by one the environment defines, which only the environment changes.
type ConflictError struct {
	Name    string
	FromEnv bool
	Message string
}

// Error is Message.
func (e *ConflictError) Error() string { return e.Message }

func fromEnv(name string) *ConflictError {
	return &ConflictError{Name: name, FromEnv: true, Message: fmt.Sprintf(
		"Credential %q is defined in the environment (AGENTQ_ADMIN_TOKEN or AGENTQ_ADMIN_TOKENS); change it there.", name)}
}

func noLive(name string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "credential", Name: name, Message: fmt.Sprintf("No live credential %q.", name)}
}

// Invalidator tells the other processes' caches that a credential changed.
type Invalidator interface {
	InvalidateCredential(ctx context.Context, name string) error
}

// Options are a Service's credentials from the environment and its collaborators.
type Options struct {
	Bootstrap string                   // AGENTQ_ADMIN_TOKEN; "" for none
	Env       []config.AdminCredential // AGENTQ_ADMIN_TOKENS, already validated
	// Invalidator, when set, carries changes to the other processes at once; without
	// it they see them within CacheTTL.
	Invalidator Invalidator
	Archetype   *baseservice.Archetype
	// CacheTTL bounds how long a stored credential's lookup is trusted (default 1 s).
	CacheTTL time.Duration
}

// DefaultCacheTTL is Options.CacheTTL's default.
const DefaultCacheTTL = time.Second

// envCred is a credential of the environment with the MAC its token is compared by.
type envCred struct {
	cred Credential
	mac  []byte
}

type cached struct {
	cred  Credential
	found bool
}

// Service resolves tokens to credentials and creates, lists, rotates and revokes the
// stored ones.
type Service struct {
	store  *store.Store // nil: the environment's credentials only
	env    []envCred    // the bootstrap credential first
	macKey []byte       // random per process: keys the constant-time comparison
	inval  Invalidator
	log    *slog.Logger
	byHash *expirable.LRU[string, cached]
	byName *expirable.LRU[string, cached]
	live   *expirable.LRU[string, bool] // whether a stored credential is live
}

// New returns a Service over st (nil: only the environment's credentials).
func New(st *store.Store, o Options) *Service {
	ttl := o.CacheTTL
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	s := &Service{store: st, inval: o.Invalidator, log: o.Archetype.Defaults().Logger, macKey: make([]byte, 32)}
	_, _ = rand.Read(s.macKey) // never fails (crypto/rand)
	s.byHash = expirable.NewLRU[string, cached](1024, nil, ttl)
	s.byName = expirable.NewLRU[string, cached](1024, nil, ttl)
	s.live = expirable.NewLRU[string, bool](1, nil, ttl)
	if o.Bootstrap != "" {
		s.addEnv(agentqtype.BootstrapCredential, agentqtype.RoleAdmin, SourceBootstrap, o.Bootstrap)
	}
	for _, c := range o.Env {
		s.addEnv(c.Name, c.Role, SourceEnv, c.Token)
	}
	return s
}

func (s *Service) addEnv(name string, role agentqtype.Role, src Source, token string) {
	s.env = append(s.env, envCred{
		cred: Credential{Name: name, Role: role, Source: src, secret: []byte(token)},
		mac:  hmacOf(s.macKey, token),
	})
}

func hmacOf(key []byte, token string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(token))
	return m.Sum(nil)
}

// newToken makes a stored credential's token and the hash kept of it.
func newToken() (token string, hash []byte) {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	token = TokenPrefix + hex.EncodeToString(b)
	return token, apikey.Hash(token)
}

// storedShape reports whether token could be a stored credential's, so that other
// strings cost no lookup.
func storedShape(token string) bool {
	rest, ok := strings.CutPrefix(token, TokenPrefix)
	if !ok || len(rest) != 2*tokenBytes {
		return false
	}
	_, err := hex.DecodeString(rest)
	return err == nil
}
