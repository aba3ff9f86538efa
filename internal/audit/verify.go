package audit

import (
	"context"
	"fmt"

	"github.com/agentq/agentq/internal/store"
)

// Verification is what Verify found: how many rows it walked, the chain's last row,
// and, when the chain does not hold, where and why.
type Verification struct {
	Rows int64
	Last Head // the last row walked (0 and Genesis for an empty log)
	// BrokenAt is the first row that does not hold (0 when the break is after the
	// last row: its tail, or the expected head, is missing); Problem says why. Both
	// are empty when the chain holds.
	BrokenAt int64
	Problem  string
}

// OK reports whether the chain holds.
func (v Verification) OK() bool { return v.Problem == "" }

// verifyPage is how many rows Verify reads at a time.
const verifyPage = 500

// Verify walks the chain from its first row: each row's prev_hash must be the hash of
// the row before it and its hash the hash of its content, and the last row must be
// the one the chain's head names. With expectHead (a head hash kept earlier), a row
// with that hash must be in the chain: a tail cut off together with the head put back
// is caught there. The first row that does not hold stops the walk.
func (l *Log) Verify(ctx context.Context, expectHead string) (Verification, error) {
	v := Verification{Last: Head{Hash: Genesis}}
	found := expectHead == ""
	for {
		rs, err := l.st.UnscopedAuditChain(ctx, v.Last.ID, verifyPage)
		if err != nil {
			return v, err
		}
		for _, r := range rs {
			if problem, err := check(r, v.Last.Hash); err != nil || problem != "" {
				v.BrokenAt, v.Problem = r.ID, problem
				return v, err
			}
			v.Rows++
			v.Last = Head{ID: r.ID, Hash: r.Hash}
			found = found || r.Hash == expectHead
		}
		if len(rs) < verifyPage {
			break
		}
	}
	return v, l.checkEnd(ctx, &v, found, expectHead)
}

// check is what is wrong with row r following a row of hash prev ("" when nothing).
func check(r store.AuditRow, prev string) (string, error) {
	if r.PrevHash != prev {
		return fmt.Sprintf("row %d: prev_hash %s is not the hash of the row before it (%s): a row before it was removed or altered",
			r.ID, short(r.PrevHash), short(prev)), nil
	}
	h, err := Hash(r)
	if err != nil {
		return "", err
	}
	if h != r.Hash {
		return fmt.Sprintf("row %d: its content does not match its hash %s: the row was altered", r.ID, short(r.Hash)), nil
	}
	return "", nil
}

// checkEnd checks the walk's end against the chain's head and the expected head.
func (l *Log) checkEnd(ctx context.Context, v *Verification, found bool, expectHead string) error {
	h, err := l.st.UnscopedAuditHead(ctx)
	if err != nil {
		return err
	}
	if h.ID != v.Last.ID || h.Hash != v.Last.Hash {
		v.Problem = fmt.Sprintf("the chain ends at row %d but its head names row %d (%s): rows after %d were removed",
			v.Last.ID, h.ID, short(h.Hash), v.Last.ID)
		return nil
	}
	if !found {
		v.Problem = fmt.Sprintf("the expected head %s is not in the chain (which ends at row %d): its tail was cut off",
			short(expectHead), v.Last.ID)
	}
	return nil
}

// short is a hash's first 12 characters, enough to tell it in a message.
func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}
