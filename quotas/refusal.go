package quotas

import "fmt"

// LimitError refuses a task that a limit of the tenant's does not allow now.
// Decision.Violated names the limits; the RetryAfter of each violated scope of
// Decision.Scopes says when a retry can pass. The task service returns it (wrapped
// with the tenant it judged) and the Go library passes it on as it is.
type LimitError struct{ Decision Decision }

// Error names the limits that refused the task.
func (e *LimitError) Error() string { return fmt.Sprintf("refused by limits %v", e.Decision.Violated) }
