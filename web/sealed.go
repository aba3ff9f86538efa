package web

import "github.com/agentq/agentq/internal/sealed"

// The panel links' and the operator sessions' tokens (package sealed).
var (
	b64    = sealed.B64
	macOf  = sealed.MAC
	seal   = sealed.Seal
	unseal = sealed.Unseal
)
