package agentq

// JanitorLeads reports whether this process's janitor holds the leader lock.
func (a *App) JanitorLeads() bool { return a.janitor.Elector().Leader() }
