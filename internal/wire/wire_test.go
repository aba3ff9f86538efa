package wire

import (
	"encoding/json"
	"testing"
)

func TestPayloadRoundTrip(t *testing.T) {
	in := Payload{TaskID: "t1", TenantID: "acme", Priority: 0, EstimateMs: 250}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"task_id":"t1","tenant_id":"acme","priority":0,"estimate_ms":250}`; string(b) != want {
		t.Fatalf("encoded %s, want %s", b, want)
	}
	var out Payload
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Fatalf("decoded %+v, want %+v", out, in)
	}
}

// A task sent before the upgrade carries its priority only as "band":"pN".
func TestPayloadDecodesLegacyBand(t *testing.T) {
	cases := []struct {
		body string
		want Payload
	}{
		{`{"task_id":"t1","tenant_id":"acme","band":"p7","estimate_ms":40}`, Payload{TaskID: "t1", TenantID: "acme", Priority: 7, EstimateMs: 40}},
		{`{"task_id":"t2","tenant_id":"acme","band":"p0"}`, Payload{TaskID: "t2", TenantID: "acme", Priority: 0}},
		// "priority" wins when both are there
		{`{"task_id":"t3","tenant_id":"acme","band":"p5","priority":9}`, Payload{TaskID: "t3", TenantID: "acme", Priority: 9}},
		{`{"task_id":"t4","tenant_id":"acme","priority":2}`, Payload{TaskID: "t4", TenantID: "acme", Priority: 2}},
	}
	for _, c := range cases {
		var p Payload
		if err := json.Unmarshal([]byte(c.body), &p); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if p != c.want {
			t.Errorf("%s decoded to %+v, want %+v", c.body, p, c.want)
		}
	}
}

func TestPayloadRefusesBadBand(t *testing.T) {
	for _, body := range []string{`{"task_id":"t1","band":"high"}`, `{"task_id":"t1","band":"5"}`, `{"task_id":"t1","band":""}`} {
		var p Payload
		if err := json.Unmarshal([]byte(body), &p); err == nil {
			t.Errorf("%s decoded to %+v, want an error", body, p)
		}
	}
}
