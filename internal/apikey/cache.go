package apikey

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
)

// ErrInvalid is returned for an unknown, revoked or wrong key. Callers answer 401 and
// never say which.
var ErrInvalid = errors.New("apikey: invalid API key")

// Record is what authentication needs of a stored key.
type Record struct {
	Kid        string
	TenantID   string
	SecretHash []byte
	Revoked    bool
	Agents     []string // allowed agents; empty = all
	Principals []string // allowed on-behalf-of users; empty = all
}

// Loader reads a key record from the system of record. It returns found=false for an
// unknown kid.
type Loader func(ctx context.Context, kid string) (rec Record, found bool, err error)

// Cache authenticates keys against records cached in process. Entries live at most
// TTL, so a revocation reaches every replica within TTL even if the invalidation
// message is lost; Invalidate drops an entry at once. The LRU cap bounds memory however
// many keys are presented; unknown kids are cached too, so a flood of made-up keys
// costs one database read per kid per TTL.
type Cache struct {
	load Loader
	lru  *expirable.LRU[string, cached]
}

type cached struct {
	rec   Record
	found bool
}

// NewCache returns a cache holding at most size records for at most ttl.
func NewCache(load Loader, size int, ttl time.Duration) *Cache {
	return &Cache{load: load, lru: expirable.NewLRU[string, cached](size, nil, ttl)}
}

// Authenticate verifies a plaintext key and returns its record.
func (c *Cache) Authenticate(ctx context.Context, plaintext string) (Record, error) {
	kid, secret, err := Parse(plaintext)
	if err != nil {
		return Record{}, ErrInvalid
	}
	e, ok := c.lru.Get(kid)
	if !ok {
		rec, found, err := c.load(ctx, kid)
		if err != nil {
			return Record{}, err
		}
		e = cached{rec: rec, found: found}
		c.lru.Add(kid, e)
	}
	if !e.found || e.rec.Revoked || !Verify(e.rec.SecretHash, secret) {
		return Record{}, ErrInvalid
	}
	return e.rec, nil
}

// Invalidate drops a kid's cached record.
func (c *Cache) Invalidate(kid string) { c.lru.Remove(kid) }

// Purge drops every cached record.
func (c *Cache) Purge() { c.lru.Purge() }

// Len is the number of cached records.
func (c *Cache) Len() int { return c.lru.Len() }
