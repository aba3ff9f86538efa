package approval_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agentq/agentq/internal/approval"
)

func TestSignVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s, err := approval.NewSigner([]byte("secret"), func() string { return "http://agentq.test:8080/" }, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	c := approval.Claims{TenantID: "acme", TaskID: uuid.Must(uuid.NewV7()), Pause: 2, Expires: now.Add(time.Hour)}
	link := s.Link(c)
	if !strings.HasPrefix(link, "http://agentq.test:8080/approve?token=") {
		t.Fatalf("link %q", link)
	}
	tok := s.Sign(c)
	got, err := s.Verify(tok)
	if err != nil || got.TenantID != c.TenantID || got.TaskID != c.TaskID || got.Pause != 2 || !got.Expires.Equal(c.Expires.UTC()) {
		t.Fatalf("verify: %+v %v", got, err)
	}

	// A changed character, another key or another purpose's token is forged.
	forged := tok[:len(tok)-2] + "AA"
	if forged == tok {
		forged = tok[:len(tok)-2] + "BB"
	}
	other, _ := approval.NewSigner([]byte("other"), nil, nil)
	for name, bad := range map[string]string{"changed": forged, "other key": other.Sign(c), "empty": "", "junk": "a.b"} {
		if _, err := s.Verify(bad); !errors.Is(err, approval.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}

	// Past its expiry it is expired, and still says what it was for.
	later, _ := approval.NewSigner([]byte("secret"), nil, func() time.Time { return now.Add(2 * time.Hour) })
	if got, err := later.Verify(tok); !errors.Is(err, approval.ErrExpired) || got.TaskID != c.TaskID {
		t.Fatalf("expired: %+v %v", got, err)
	}
}

func FuzzVerify(f *testing.F) {
	s, _ := approval.NewSigner([]byte("secret"), nil, nil)
	f.Add(s.Sign(approval.Claims{TenantID: "acme", TaskID: uuid.New(), Pause: 1, Expires: time.Now().Add(time.Hour)}))
	f.Add("x.y")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := s.Verify(tok)
		if err == nil && (c.TenantID == "" || c.Pause < 1) {
			t.Fatalf("accepted %q as %+v", tok, c)
		}
	})
}
