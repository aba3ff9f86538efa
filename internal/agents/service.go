// Package agents is the HTTP-agent domain service: the rules an HTTP agent's
// registration must satisfy (name, URL, step timeout, headers), registering,
// replacing, reading, deleting it and rotating its signing secret, and the resolver
// through which the workers find the registered agents. The admin API goes through
// it; it knows nothing of HTTP requests.
package agents

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/textproto"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/agentq/agentq/agentqtype"
	"github.com/agentq/agentq/internal/audit"
	"github.com/agentq/agentq/internal/baseservice"
	"github.com/agentq/agentq/internal/store"
	"github.com/agentq/agentq/runtime"
)

// Agent is a registered HTTP agent. SigningSecret is for the workers alone: it is
// never shown after the call that made it.
type Agent = store.Agent

// notFound is a name with no HTTP agent.
func notFound(name string) *agentqtype.NotFoundError {
	return &agentqtype.NotFoundError{What: "agent", Name: name, Message: fmt.Sprintf("No HTTP agent %q.", name)}
}

// invalid is a refused registration field: name, url, step_timeout_s or headers.
func invalid(field, format string, args ...any) *agentqtype.InvalidError {
	return agentqtype.Invalid(field, format, args...)
}

// BuiltinError is a registration under the name of an agent that runs in process
// (built in, or registered by the embedding program): the HTTP agent would never run.
type BuiltinError struct{ Name string }

func (e *BuiltinError) Error() string {
	return fmt.Sprintf("Agent %q is built in or registered in process; pick another name.", e.Name)
}

// Local tells the agents that run in process.
type Local interface {
	Local(name string) bool
}

// Bounds of a registration.
const (
	MaxURL          = 2048 // bytes of an agent's URL
	MaxHeaderValue  = 4096 // bytes of a configured header value
	DefaultTimeoutS = 30.0 // a step's timeout when none is given, in seconds
	MaxTimeoutS     = 3600.0
)

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// reservedHeaders are set by the runtime on every step request.
var reservedHeaders = map[string]bool{
	"Content-Type": true, "Content-Length": true, "Host": true, "Traceparent": true, "Tracestate": true,
	"X-Agentq-Signature": true, "X-Agentq-Timestamp": true, "X-Agentq-Agent": true,
	"X-Agentq-Task-Id": true, "X-Agentq-Step": true, "X-Agentq-Attempt": true,
}

// Service registers and reads HTTP agents.
type Service struct {
	store *store.Store
	local Local
}

// New returns a Service over st; local, when not nil, names the in-process agents
// whose names an HTTP agent may not take.
func New(st *store.Store, local Local) *Service {
	return &Service{store: st, local: local}
}

// CheckName refuses a name an HTTP agent cannot have: not 1 to 63 letters, digits,
// '.', '-' or '_' (an *agentqtype.InvalidError), or an in-process agent's (a
// *BuiltinError). Put checks it too; callers that read a request body after the name
// call it first.
func (s *Service) CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return invalid("name", "Agent names are 1 to 63 letters, digits, '.', '-' or '_'.")
	}
	if s.local != nil && s.local.Local(name) {
		return &BuiltinError{Name: name}
	}
	return nil
}

// PutParams register or replace an HTTP agent.
type PutParams struct {
	Name         string
	URL          string            // absolute http or https, printable ASCII
	StepTimeoutS *float64          // nil: DefaultTimeoutS
	Headers      map[string]string // sent with every step; agentq's own are refused
}

// Put is what a Put call made: the agent, and, when the call registered it, the
// signing secret made for it (shown this once).
type Put struct {
	Agent         Agent
	Created       bool
	SigningSecret string // "" when an existing agent was replaced
}

// Put validates p and registers the agent, or replaces the one of that name. A new
// agent gets a signing secret of its own; replacing one keeps the secret it verifies
// with (rotation is RotateSecret).
func (s *Service) Put(ctx context.Context, p PutParams) (Put, error) {
	if err := s.CheckName(p.Name); err != nil {
		return Put{}, err
	}
	if len(p.URL) > MaxURL || strings.ContainsFunc(p.URL, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return Put{}, invalid("url", "url must be printable ASCII of at most %d bytes.", MaxURL)
	}
	u, err := url.Parse(p.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Put{}, invalid("url", "url must be an absolute http or https URL.")
	}
	timeout := DefaultTimeoutS
	if p.StepTimeoutS != nil {
		timeout = *p.StepTimeoutS
	}
	if !(timeout > 0) || timeout > MaxTimeoutS {
		return Put{}, invalid("step_timeout_s", "step_timeout_s must be above 0 and at most 3600.")
	}
	for k, v := range p.Headers {
		if !validHeader(k, v) {
			return Put{}, invalid("headers", "Header %q is not a valid HTTP header.", k)
		}
		if reservedHeaders[textproto.CanonicalMIMEHeaderKey(k)] {
			return Put{}, invalid("headers", "Header %q is set by agentq and cannot be configured.", k)
		}
	}
	secret, err := newSigningSecret()
	if err != nil {
		return Put{}, err
	}
	var a Agent
	var created bool
	err = s.store.InTx(ctx, func(tx *store.Store) error {
		old, err := lockAgent(ctx, tx, p.Name)
		if err != nil {
			return err
		}
		a, created, err = tx.PutAgent(ctx, store.PutAgentParams{
			Name: p.Name, URL: p.URL, StepTimeoutS: timeout, Headers: p.Headers, SigningSecret: secret,
		})
		if err != nil {
			return err
		}
		_, err = audit.Append(ctx, tx, audit.Entry{Action: actionPut, Object: object(p.Name), Before: old, After: audit.Agent(a)})
		return err
	})
	if err != nil {
		return Put{}, err
	}
	out := Put{Agent: a, Created: created}
	if created {
		out.SigningSecret = secret
	}
	return out, nil
}

// RotateSecret gives agent name a new signing secret and returns it (shown this
// once). Workers sign with it within a second (their resolver's cache); the old one
// stops verifying then.
func (s *Service) RotateSecret(ctx context.Context, name string) (Agent, string, error) {
	secret, err := newSigningSecret()
	if err != nil {
		return Agent{}, "", err
	}
	var a Agent
	err = s.store.InTx(ctx, func(tx *store.Store) error {
		old, err := lockAgent(ctx, tx, name)
		if err != nil {
			return err
		}
		if a, err = tx.RotateAgentSecret(ctx, name, secret); err != nil {
			return err
		}
		_, err = audit.Append(ctx, tx, audit.Entry{Action: "agent.rotate_secret", Object: object(name), Before: old, After: audit.Agent(a)})
		return err
	})
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Agent{}, "", notFound(name)
	}
	if err != nil {
		return Agent{}, "", err
	}
	return a, secret, nil
}

// Get returns agent name, or a *agentqtype.NotFoundError.
func (s *Service) Get(ctx context.Context, name string) (Agent, error) {
	a, err := s.store.GetAgent(ctx, name)
	if errors.Is(err, agentqtype.ErrNotFound) {
		return Agent{}, notFound(name)
	}
	return a, err
}

// List returns every HTTP agent, by name (never nil).
func (s *Service) List(ctx context.Context) ([]Agent, error) {
	return s.store.ListAgents(ctx)
}

// Delete removes agent name, or returns a *agentqtype.NotFoundError. Its queued tasks
// then fail as tasks of an unknown agent.
func (s *Service) Delete(ctx context.Context, name string) error {
	err := s.store.InTx(ctx, func(tx *store.Store) error {
		old, err := lockAgent(ctx, tx, name)
		if err != nil {
			return err
		}
		if err := tx.DeleteAgent(ctx, name); err != nil {
			return err
		}
		_, err = audit.Append(ctx, tx, audit.Entry{Action: "agent.delete", Object: object(name), Before: old})
		return err
	})
	if errors.Is(err, agentqtype.ErrNotFound) {
		return notFound(name)
	}
	return err
}

// newSigningSecret makes an agent's signing secret: 32 random bytes. Agents key their
// HMAC with the whole string as shown.
func newSigningSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("signing secret: %w", err)
	}
	return "aqsig_" + base64.RawURLEncoding.EncodeToString(b), nil
}

// validHeader tells a header the runtime can send: a token name (RFC 9110) and a
// value without control characters (tab aside), at most MaxHeaderValue bytes.
func validHeader(name, value string) bool {
	if name == "" || len(value) > MaxHeaderValue {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return !strings.ContainsFunc(value, func(r rune) bool { return r != '\t' && isControl(r) })
}

func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// ResolverTTL is how long the resolver trusts what it read of an agent: a PUT, DELETE
// or secret rotation reaches every worker within it.
const ResolverTTL = time.Second

// Resolver returns the function through which the worker runtime finds HTTP agents
// (runtime.Registry.Remote). It caches each agent for ResolverTTL, so a step does not
// cost a query. Each agent's steps are signed with its own secret; an agent registered
// before per-agent secrets (none stored) falls back to the deployment-wide shared
// secret until it is rotated, and without one its steps fail. It logs through arch
// (nil: the defaults).
func (s *Service) Resolver(shared []byte, arch *baseservice.Archetype) func(ctx context.Context, name string) (runtime.Executor, bool, error) {
	log := arch.Defaults().Logger
	var warned sync.Map
	type entry struct {
		exec  runtime.Executor
		found bool
	}
	cache := expirable.NewLRU[string, entry](1000, nil, ResolverTTL)
	return func(ctx context.Context, name string) (runtime.Executor, bool, error) {
		if e, ok := cache.Get(name); ok {
			return e.exec, e.found, nil
		}
		ag, err := s.store.GetAgent(ctx, name)
		if errors.Is(err, agentqtype.ErrNotFound) {
			cache.Add(name, entry{})
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		secret := []byte(ag.SigningSecret)
		if len(secret) == 0 {
			secret = shared
			if _, seen := warned.LoadOrStore(ag.Name, true); !seen {
				if len(shared) > 0 {
					log.Warn("HTTP agent has no signing secret of its own; its steps are signed with the shared AGENTQ_AGENT_SECRET until it is rotated",
						"agent", ag.Name)
				} else {
					log.Error("HTTP agent has no signing secret and AGENTQ_AGENT_SECRET is not set: its steps fail until it is rotated",
						"agent", ag.Name)
				}
			}
		}
		exec := &runtime.HTTPAgent{
			Name: ag.Name, URL: ag.URL, Headers: ag.Headers, Secret: secret,
			Timeout: time.Duration(ag.StepTimeoutS * float64(time.Second)),
		}
		cache.Add(name, entry{exec: exec, found: true})
		return exec, true, nil
	}
}
