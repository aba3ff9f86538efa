// Package netguard keeps outgoing requests to destinations on the internet: it
// refuses loopback, link-local, private (RFC 1918), CGNAT (100.64.0.0/10), unique
// local (fc00::/7), unspecified, multicast, broadcast and special-purpose addresses,
// and the IPv6 forms that carry any of them (IPv4-mapped, NAT64, 6to4), unless an operator's allow-list holds the
// address. The check runs on the address a connection is about to be made to (a
// net.Dialer Control func), after name resolution, so a name that resolves to a
// refused address — at registration or at any later time — cannot pass.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// class is a range of addresses refused by default, with what it is called and its
// short code.
type class struct {
	code, name string
	prefixes   []netip.Prefix
}

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// refused are the classes of addresses a destination may not be in by default.
var refused = []class{
	{"unspecified", "an unspecified address", mustPrefixes("0.0.0.0/8", "::/128")},
	{"loopback", "a loopback address", mustPrefixes("127.0.0.0/8", "::1/128")},
	{"link_local", "a link-local address", mustPrefixes("169.254.0.0/16", "fe80::/10")},
	{"private", "a private address", mustPrefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")},
	{"cgnat", "a shared (CGNAT) address", mustPrefixes("100.64.0.0/10")},
	{"unique_local", "a unique local address", mustPrefixes("fc00::/7")},
	{"multicast", "a multicast address", mustPrefixes("224.0.0.0/4", "ff00::/8")},
	{"broadcast", "a broadcast address", mustPrefixes("255.255.255.255/32")},
	{"special_purpose", "a special-purpose address", mustPrefixes("192.0.0.0/24", "198.18.0.0/15", "240.0.0.0/4", "fec0::/10", "100::/64")},
	// Translation prefixes that carry no IPv4 address at a fixed place: refused whole.
	{"translated", "a translated address", mustPrefixes("64:ff9b:1::/48", "2001::/32")},
}

// embedded are the IPv6 prefixes whose addresses carry an IPv4 address that a gateway
// translates to (NAT64's well-known prefix, 6to4, IPv4-compatible), with the byte at
// which it starts: such an address is judged as the IPv4 address it carries.
var embedded = []struct {
	prefix netip.Prefix
	at     int
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},
	{netip.MustParsePrefix("2002::/16"), 2},
	{netip.MustParsePrefix("::/96"), 12},
}

// carried is the IPv4 address an IPv6 address of an embedding prefix carries, else addr.
func carried(addr netip.Addr) netip.Addr {
	if !addr.Is6() || addr == netip.IPv6Unspecified() {
		return addr
	}
	for _, e := range embedded {
		if e.prefix.Contains(addr) {
			b := addr.As16()
			v4 := netip.AddrFrom4([4]byte(b[e.at : e.at+4]))
			if b[e.at] == 0 { // ::1 and its like: no IPv4 address in them
				return addr
			}
			return v4
		}
	}
	return addr
}

// ErrRefused matches (errors.Is) every *RefusedError.
var ErrRefused = errors.New("netguard: destination refused")

// RefusedError is an address the guard refuses. Its message names the kind of
// address only, never the address or the name it was reached by.
type RefusedError struct {
	Class string // "a loopback address", …
	// Code is the class's short name: unspecified, loopback, link_local, private,
	// cgnat, unique_local, multicast, broadcast, special_purpose, translated,
	// invalid (an address that is none) or unparsable (a dial address that is none).
	Code string
}

func (e *RefusedError) Error() string {
	return "destination refused: " + e.Class + " (not in the allowed networks)"
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// Guard decides which destination addresses may be reached. The zero Guard
// refuses every default-refused class; Allow lists the networks let through anyway.
type Guard struct {
	Allow []netip.Prefix
}

// Check returns nil when addr may be reached, else a *RefusedError. An IPv4-mapped
// IPv6 address is judged as the IPv4 address it carries, and so is one of NAT64's
// well-known prefix, 6to4 or IPv4-compatible (refused if either the IPv6 address or
// the IPv4 one it carries is); a zone is ignored.
func (g Guard) Check(addr netip.Addr) error {
	addr = addr.Unmap().WithZone("")
	if !addr.IsValid() {
		return &RefusedError{Class: "an invalid address", Code: "invalid"}
	}
	if err := g.check(addr); err != nil {
		return err
	}
	if v4 := carried(addr); v4 != addr {
		return g.check(v4)
	}
	return nil
}

// check is Check of one address, as it is.
func (g Guard) check(addr netip.Addr) error {
	for _, p := range g.Allow {
		if p.Contains(addr) {
			return nil
		}
	}
	for _, c := range refused {
		for _, p := range c.prefixes {
			if p.Contains(addr) {
				return &RefusedError{Class: c.name, Code: c.code}
			}
		}
	}
	return nil
}

// Control is a net.Dialer Control func: it refuses a connection to an address Check
// refuses, before it is made.
func (g Guard) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Class: "an unparsable address", Code: "unparsable"}
	}
	return g.Check(ap.Addr())
}

// Dialer is a net.Dialer whose connections go through the guard.
func (g Guard) Dialer() *net.Dialer {
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: g.Control}
}

// Transport is an HTTP transport that dials through the guard and uses no proxy (a
// proxy would make the connection to the destination itself, unchecked).
func (g Guard) Transport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	d := g.Dialer()
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
	return t
}

// CheckHost judges a URL's host when it is an address literal (IPv4, or IPv6 without
// its brackets): nil for a name, whose addresses are judged when it is dialled.
func (g Guard) CheckHost(host string) error {
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return nil
	}
	return g.Check(addr)
}

// ParseNets reads a comma-separated list of CIDRs ("127.0.0.0/8, fd00::/8"); a bare
// address is its own /32 or /128. Empty is none.
func ParseNets(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("netguard: %q is not a CIDR (such as 10.1.0.0/16) or an address", f)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// Loopback is the allow-list of the loopback networks, IPv4 and IPv6.
func Loopback() []netip.Prefix { return mustPrefixes("127.0.0.0/8", "::1/128") }
