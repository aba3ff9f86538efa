// Package numfmt writes numbers for the pages people read: the tenant panel and the
// operator view.
package numfmt

import "strings"

// GroupDigits puts thousands separators in a decimal number: "-1234567.5" is
// "-1,234,567.5".
func GroupDigits(s string) string {
	intPart, frac, _ := strings.Cut(s, ".")
	neg := strings.HasPrefix(intPart, "-")
	intPart = strings.TrimPrefix(intPart, "-")
	var b strings.Builder
	for i, r := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	out := b.String()
	if neg {
		out = "-" + out
	}
	if frac != "" {
		out += "." + frac
	}
	return out
}
