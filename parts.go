package agentq

import (
	"time"

	"github.com/agentq/agentq/internal/appparts"
)

// The module's end-to-end tests reach an App's components through internal/appparts
// rather than through exported methods, which would put internal types into the
// library's API.
func init() {
	appparts.Register(appparts.Hooks{
		Of: func(app any) appparts.Parts {
			a := app.(*App)
			return appparts.Parts{
				Store: a.store, Redis: a.rdb, Keys: a.keys, Quotas: a.quotas, Admission: a.admission,
				Scheduler: a.sched, Worker: a.worker, API: a.api,
				JanitorLeads: func() bool { return a.janitor.Elector().Leader() },
			}
		},
		SetRecoveryEvery: func(opts any, d time.Duration) { opts.(*Options).recoveryEvery = d },
	})
}
