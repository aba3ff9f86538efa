package rkeys_test

import (
	"context"
	"path"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/agentq/agentq/internal/rkeys"
	"github.com/agentq/agentq/internal/testenv"
)

// AsynqKeyPrefix must cover the keys asynq really writes for a deployment's queue,
// or tests and benchmarks leave them behind.
func TestAsynqKeyPrefixCoversAsynqQueueKeys(t *testing.T) {
	rdb, keys := testenv.Redis(t, 1)
	ctx := context.Background()
	queue := keys.AsynqQueue("default")
	t.Cleanup(func() { rdb.SRem(context.Background(), "asynq:queues", queue) }) // asynq's global set of queue names
	cl := asynq.NewClientFromRedisClient(rdb)
	if _, err := cl.EnqueueContext(ctx, asynq.NewTask("probe", nil), asynq.Queue(queue), asynq.TaskID("probe1")); err != nil {
		t.Fatal(err)
	}
	var found []string
	iter := rdb.Scan(ctx, 0, "asynq:*"+keys.Prefix()+"*", 1000).Iterator()
	for iter.Next(ctx) {
		found = append(found, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("asynq wrote no key naming the queue: the probe measured nothing")
	}
	for _, k := range found {
		if !strings.HasPrefix(k, keys.AsynqKeyPrefix()) {
			t.Errorf("asynq key %q of queue %q is not under AsynqKeyPrefix %q", k, queue, keys.AsynqKeyPrefix())
		}
	}
}

func TestDispatchingMemberRoundTrip(t *testing.T) {
	m := rkeys.DispatchingMember(7, 250, "acme", "0192-task")
	if m != "7:250:acme:0192-task" {
		t.Fatalf("member = %q", m)
	}
	p, est, tenant, task, err := rkeys.ParseDispatchingMember(m)
	if err != nil || p != 7 || est != 250 || tenant != "acme" || task != "0192-task" {
		t.Fatalf("parsed %d %d %q %q %v", p, est, tenant, task, err)
	}
	for _, bad := range []string{"", "7:250:acme", "x:250:acme:t", "7:y:acme:t"} {
		if _, _, _, _, err := rkeys.ParseDispatchingMember(bad); err == nil {
			t.Errorf("ParseDispatchingMember(%q) accepted it", bad)
		}
	}
}

func TestChangedMessages(t *testing.T) {
	if kid, tenant := rkeys.ParseChanged(rkeys.KeyChanged("k1")); kid != "k1" || tenant != "" {
		t.Fatalf("key message read as %q %q", kid, tenant)
	}
	if kid, tenant := rkeys.ParseChanged(rkeys.TenantChanged("acme")); kid != "" || tenant != "acme" {
		t.Fatalf("tenant message read as %q %q", kid, tenant)
	}
	if kid, tenant := rkeys.ParseChanged("1"); kid != "" || tenant != "" {
		t.Fatalf("unknown message read as %q %q", kid, tenant)
	}
	msg := rkeys.CredentialChanged("ops")
	if kid, tenant := rkeys.ParseChanged(msg); kid != "" || tenant != "" {
		t.Fatalf("credential message read as key %q or tenant %q", kid, tenant)
	}
	if name, ok := rkeys.ParseCredentialChanged(msg); !ok || name != "ops" {
		t.Fatalf("credential message read as %q %v", name, ok)
	}
	if _, ok := rkeys.ParseCredentialChanged(rkeys.KeyChanged("ops")); ok {
		t.Fatal("a key message read as a credential's")
	}
}

// Fields a script matches by prefix must start with the prefix it is given, and the
// shared overflow bucket must not be a field any user can name.
func TestAdmissionFieldFormats(t *testing.T) {
	cases := map[string]string{
		rkeys.KeyBucketField("k1"):          rkeys.KeyBucketPrefix,
		rkeys.KeyAgentField("k1", "writer"): rkeys.KeyAgentPrefix,
		rkeys.UserField("bob"):              rkeys.UserPrefix,
		rkeys.TokensField("20261201"):       rkeys.TokensPrefix,
		rkeys.USDField("20261201"):          rkeys.USDPrefix,
		rkeys.UserOverflowField:             rkeys.UserPrefix,
	}
	for f, prefix := range cases {
		if !strings.HasPrefix(f, prefix) {
			t.Errorf("field %q does not start with %q", f, prefix)
		}
	}
	if ok, _ := path.Match(rkeys.KeyAgentFieldsPattern("k1"), rkeys.KeyAgentField("k1", "writer")); !ok {
		t.Error("KeyAgentFieldsPattern misses the key's agent fields")
	}
	if ok, _ := path.Match(rkeys.KeyAgentFieldsPattern("k1"), rkeys.KeyAgentField("k10", "writer")); ok {
		t.Error("KeyAgentFieldsPattern matches another key's agent fields")
	}
	if !strings.Contains(rkeys.UserOverflowField, "\x00") {
		t.Error("the overflow field can be named by a user")
	}
}
