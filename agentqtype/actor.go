package agentqtype

import "context"

// Role is what an admin credential may do: admin everything, operator the writes to
// tenants and their configuration, finance the money reads, viewer the other reads.
type Role string

// Admin credential roles, from the most to the least able.
const (
	RoleAdmin    Role = "admin"
	RoleOperator Role = "operator"
	RoleFinance  Role = "finance"
	RoleViewer   Role = "viewer"
)

// ActorKind says what kind of authority made a change.
type ActorKind string

// Actor kinds: a named admin credential, a tenant's API key, a signed panel or
// approval link, or the command line writing to the database directly.
const (
	ActorCredential ActorKind = "credential"
	ActorKey        ActorKind = "key"
	ActorLink       ActorKind = "link"
	ActorCLI        ActorKind = "cli"
)

// Actor is who made a change, as the authority the request proved: a credential's
// name and role, a key's id, a link, or "cli:<os user>". Claimed names a caller sends
// (X-Agentq-Actor, X-Agentq-Reason) are kept apart: they are not proven.
type Actor struct {
	Kind ActorKind `json:"kind"`
	Name string    `json:"name"`
	Role Role      `json:"role,omitempty"`
	// ClaimedActor and Reason are what the caller says, kept as said.
	ClaimedActor string `json:"-"`
	Reason       string `json:"-"`
	// RequestID ties the change to the request that made it ("" outside HTTP).
	RequestID string `json:"-"`
}

type actorKey struct{}

// WithActor returns ctx carrying who acts in it: the admin API's and the tenant
// API's authentication put it there, the CLI for its direct writes.
func WithActor(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// ActorFrom is the Actor ctx carries, and whether it carries one.
func ActorFrom(ctx context.Context) (Actor, bool) {
	a, ok := ctx.Value(actorKey{}).(Actor)
	return a, ok
}

// ActorLibrary is a change a Go program made through the library, or anything else
// that named no actor on its context.
const ActorLibrary ActorKind = "library"
