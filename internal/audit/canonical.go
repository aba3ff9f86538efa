package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// Canonical is JSON text b in the chain's canonical encoding: object keys sorted, no
// insignificant space, numbers as their exact decimal value; empty b is null. The
// text a row is written with and the text Postgres gives back (jsonb reorders keys
// and rewrites numbers) encode the same.
func Canonical(b []byte) (json.RawMessage, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return json.RawMessage("null"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical JSON: %w", err)
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case map[string]any:
		return writeObject(buf, x)
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case json.Number:
		r, ok := rat(string(x))
		if !ok {
			return fmt.Errorf("canonical JSON: number %q", x)
		}
		buf.WriteString(exact(r))
	default: // strings, booleans, null
		b, err := json.Marshal(x)
		if err != nil {
			return fmt.Errorf("canonical JSON: %w", err)
		}
		buf.Write(b)
	}
	return nil
}

func writeObject(buf *bytes.Buffer, m map[string]any) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	buf.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		buf.Write(kb)
		buf.WriteByte(':')
		if err := writeCanonical(buf, m[k]); err != nil {
			return err
		}
	}
	buf.WriteByte('}')
	return nil
}

// exact writes r as a JSON number with every digit it has: a JSON number is a finite
// decimal, so its reduced denominator is 2^a·5^b and max(a, b) decimals hold it.
func exact(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	d := new(big.Int).Set(r.Denom())
	n := 0
	for _, p := range []int64{2, 5} {
		k, q, m := 0, big.NewInt(p), new(big.Int)
		for {
			quo, rem := new(big.Int).QuoRem(d, q, m)
			if rem.Sign() != 0 {
				break
			}
			d, k = quo, k+1
		}
		n = max(n, k)
	}
	return r.FloatString(n)
}

// rat reads a JSON number exactly; one with an exponent past ±1000 is refused rather
// than expanded (no value of a row comes near it).
func rat(s string) (*big.Rat, bool) {
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		if e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+")); err != nil || e > 1000 || e < -1000 {
			return nil, false
		}
	}
	return new(big.Rat).SetString(s)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
