package agentqtype

import (
	"regexp"
	"slices"
)

// roles are the roles from the most to the least able: each may do what every role
// after it may.
var roles = []Role{RoleAdmin, RoleOperator, RoleFinance, RoleViewer}

// Roles returns every role, from the most to the least able.
func Roles() []Role { return slices.Clone(roles) }

// Valid reports whether r is one of Roles.
func (r Role) Valid() bool { return slices.Contains(roles, r) }

// Allows reports whether r may do what needs at least min. An unknown role allows
// nothing, and nothing is allowed under an unknown min.
func (r Role) Allows(min Role) bool {
	have, need := slices.Index(roles, r), slices.Index(roles, min)
	return have >= 0 && need >= 0 && have <= need
}

// credentialName is what an admin credential's name may be: it appears in URL paths,
// in AGENTQ_ADMIN_TOKENS (name:role:token, comma-separated) and in audit rows.
var credentialName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidCredentialName reports whether name may name an admin credential: 1 to 63
// lower-case letters, digits, ".", "-" and "_", starting with a letter or digit.
func ValidCredentialName(name string) bool { return credentialName.MatchString(name) }

// BootstrapCredential is the name of the credential AGENTQ_ADMIN_TOKEN is; no other
// credential may take it.
const BootstrapCredential = "admin"
