package agentq

// Halt stops the janitor as a crash would (see halt). For tests.
func (j *Janitor) Halt() { j.halt() }

// SetConfig replaces the janitor's configuration (defaults fill zero fields). For tests.
func (j *Janitor) SetConfig(c JanitorConfig) { j.cfg = c.withDefaults() }

// AfterSnapshot sets a hook run between a tenant pass's Postgres read and its Redis
// read. For tests.
func (j *Janitor) AfterSnapshot(f func(pass string)) { j.afterSnapshot = f }
