package config

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/agentq/agentq/agentqtype"
)

// AdminCredential is an admin credential the environment defines: a name, a role and
// the bearer token. Printed or logged, it shows its name and role, never the token.
type AdminCredential struct {
	Name  string
	Role  agentqtype.Role
	Token string
}

// String is the credential without its token.
func (c AdminCredential) String() string { return c.Name + ":" + string(c.Role) + ":********" }

// GoString is String: %#v shows no token either.
func (c AdminCredential) GoString() string { return "config.AdminCredential{" + c.String() + "}" }

// LogValue is the credential's name and role, for slog.
func (c AdminCredential) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", c.Name), slog.String("role", string(c.Role)))
}

// ParseAdminTokens reads AGENTQ_ADMIN_TOKENS: name:role:token entries separated by
// commas (the token is everything after the second colon). A refused entry is named
// by its position, and by its name once that is a valid one; an error never quotes a
// token, nor a field that might be one put in the wrong place.
func ParseAdminTokens(v string) ([]AdminCredential, error) {
	var creds []AdminCredential
	for i, entry := range strings.Split(v, ",") {
		parts := strings.SplitN(strings.TrimSpace(entry), ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("AGENTQ_ADMIN_TOKENS entry %d: want name:role:token", i+1)
		}
		creds = append(creds, AdminCredential{
			Name: strings.TrimSpace(parts[0]), Role: agentqtype.Role(strings.TrimSpace(parts[1])), Token: strings.TrimSpace(parts[2]),
		})
	}
	if msg := checkAdminCredentials(creds, ""); msg != "" {
		return nil, fmt.Errorf("AGENTQ_ADMIN_TOKENS %s", msg)
	}
	return creds, nil
}

// checkAdminTokens refuses AdminTokens that ParseAdminTokens would refuse, and one
// whose token is the bootstrap credential's (AdminToken).
func (c Config) checkAdminTokens() error {
	if msg := checkAdminCredentials(c.AdminTokens, c.AdminToken); msg != "" {
		return &Error{Field: "AdminTokens", Message: msg}
	}
	return nil
}

// checkAdminCredentials says what is wrong with the first refused credential ("" when
// none is), naming it by its position.
func checkAdminCredentials(creds []AdminCredential, bootstrap string) string {
	names := map[string]int{}
	tokens := map[string]int{}
	for i, c := range creds {
		entry := fmt.Sprintf("entry %d", i+1)
		if !agentqtype.ValidCredentialName(c.Name) {
			return entry + ": the name must be 1 to 63 lower-case letters, digits, '.', '-' or '_', starting with a letter or digit"
		}
		entry += fmt.Sprintf(" (%q)", c.Name)
		switch j, dup := names[c.Name]; {
		case c.Name == agentqtype.BootstrapCredential:
			return entry + ": \"admin\" is the name of AGENTQ_ADMIN_TOKEN's credential; choose another"
		case dup:
			return fmt.Sprintf("%s: entry %d has the same name", entry, j)
		case !c.Role.Valid():
			return entry + ": the role must be one of admin, operator, finance, viewer"
		case c.Token == "":
			return entry + ": the token is empty"
		}
		if j, dup := tokens[c.Token]; dup {
			return fmt.Sprintf("%s: entry %d has the same token", entry, j)
		}
		if bootstrap != "" && c.Token == bootstrap {
			return entry + ": the token is AGENTQ_ADMIN_TOKEN's"
		}
		names[c.Name], tokens[c.Token] = i+1, i+1
	}
	return ""
}
