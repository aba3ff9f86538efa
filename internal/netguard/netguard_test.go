package netguard

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	loop := Guard{Allow: Loopback()}
	for _, tc := range []struct {
		addr    string
		g       Guard
		refused string // the class, "" when allowed
	}{
		{"93.184.215.14", Guard{}, ""},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", Guard{}, ""},
		{"8.8.8.8", loop, ""},
		{"127.0.0.1", Guard{}, "loopback"},
		{"127.255.0.9", Guard{}, "loopback"},
		{"::1", Guard{}, "loopback"},
		{"::ffff:127.0.0.1", Guard{}, "loopback"},
		{"10.0.0.5", Guard{}, "private"},
		{"172.16.3.4", Guard{}, "private"},
		{"172.31.255.255", Guard{}, "private"},
		{"172.32.0.1", Guard{}, ""},
		{"192.168.1.1", Guard{}, "private"},
		{"::ffff:10.0.0.5", Guard{}, "private"},
		{"169.254.169.254", Guard{}, "link-local"},
		{"::ffff:169.254.169.254", Guard{}, "link-local"},
		{"fe80::1", Guard{}, "link-local"},
		{"fe80::1%eth0", Guard{}, "link-local"},
		{"100.64.0.1", Guard{}, "CGNAT"},
		{"100.127.255.254", Guard{}, "CGNAT"},
		{"100.128.0.1", Guard{}, ""},
		{"fc00::1", Guard{}, "unique local"},
		{"fd12:3456::1", Guard{}, "unique local"},
		{"0.0.0.0", Guard{}, "unspecified"},
		{"::", Guard{}, "unspecified"},
		{"224.0.0.1", Guard{}, "multicast"},
		{"ff02::1", Guard{}, "multicast"},
		{"255.255.255.255", Guard{}, "broadcast"},
		// IPv6 forms that carry an IPv4 address a gateway may translate to: judged as it.
		{"64:ff9b::a9fe:a9fe", Guard{}, "link-local"},                   // NAT64 of 169.254.169.254
		{"64:ff9b::a00:5", Guard{}, "private"},                          // NAT64 of 10.0.0.5
		{"64:ff9b::5db8:d70e", Guard{}, ""},                             // NAT64 of a public address
		{"64:ff9b:1::a00:5", Guard{}, "translated"},                     // local-use NAT64: refused whole
		{"2002:7f00:1::", Guard{}, "loopback"},                          // 6to4 of 127.0.0.1
		{"2002:a00:5::1", Guard{}, "private"},                           // 6to4 of 10.0.0.5
		{"::7f00:1", Guard{}, "loopback"},                               // IPv4-compatible 127.0.0.1
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", Guard{}, "translated"}, // Teredo
		// Special-purpose ranges that are no destination on the internet.
		{"192.0.0.8", Guard{}, "special"},
		{"198.18.0.1", Guard{}, "special"},
		{"240.0.0.1", Guard{}, "special"},
		{"fec0::1", Guard{}, "special"},
		{"100::1", Guard{}, "special"},
		// The allow-list lets its networks through, and only those.
		{"127.0.0.1", loop, ""},
		{"::1", loop, ""},
		{"::ffff:127.0.0.1", loop, ""},
		{"10.0.0.5", loop, "private"},
		{"169.254.169.254", loop, "link-local"},
		{"10.1.2.3", Guard{Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}, ""},
		{"10.2.0.1", Guard{Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}, "private"},
	} {
		err := tc.g.Check(netip.MustParseAddr(tc.addr))
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%s (allow %v): refused: %v", tc.addr, tc.g.Allow, err)
		case tc.refused != "" && (!errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%s (allow %v): %v, want refused as %s", tc.addr, tc.g.Allow, err, tc.refused)
		case err != nil && strings.Contains(err.Error(), strings.Split(tc.addr, "%")[0]):
			t.Errorf("%s: the error %q names the address", tc.addr, err)
		}
	}
}

func TestCheckHost(t *testing.T) {
	g := Guard{}
	for host, refused := range map[string]bool{
		"example.com": false, "localhost": false, // names are judged when dialled
		"127.0.0.1": true, "::1": true, "10.0.0.5": true, "169.254.169.254": true, "93.184.215.14": false,
	} {
		if err := g.CheckHost(host); (err != nil) != refused {
			t.Errorf("%s: %v", host, err)
		}
	}
}

func TestParseNets(t *testing.T) {
	got, err := ParseNets(" 127.0.0.0/8, ::1 ,10.1.2.3/16,")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("10.1.0.0/16")}
	if len(got) != len(want) {
		t.Fatalf("%v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%d: %v, want %v", i, got[i], want[i])
		}
	}
	if nets, err := ParseNets(""); err != nil || len(nets) != 0 {
		t.Errorf("empty: %v %v", nets, err)
	}
	for _, bad := range []string{"10.0.0.0/33", "nope", "10.0.0.0/8;"} {
		if _, err := ParseNets(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// The guard refuses at dial time, whatever name led there: "localhost" resolves to
// the loopback address, which the default guard refuses and the loopback allow-list
// lets through.
func TestTransportRefusesAtDialTime(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	url := "http://localhost:" + port + "/"
	get := func(g Guard) error {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
		res, err := (&http.Client{Transport: g.Transport()}).Do(req)
		if err == nil {
			res.Body.Close()
		}
		return err
	}
	if err := get(Guard{}); !errors.Is(err, ErrRefused) {
		t.Errorf("default guard: %v, want refused", err)
	}
	if err := get(Guard{Allow: Loopback()}); err != nil {
		t.Errorf("loopback allowed: %v", err)
	}
}
