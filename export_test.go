package agentq

// Halt stops the janitor as a crash would (see halt). For tests.
func (j *Janitor) Halt() { j.halt() }
