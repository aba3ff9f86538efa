package rkeys_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// luaScript is one redis.NewScript of the module, with the comment above it.
type luaScript struct {
	where string // file:line
	name  string
	doc   string
	src   string
}

// moduleScripts finds every redis.NewScript in the module's non-test sources and
// evaluates its source (string literals and package-level string constants joined
// with +).
func moduleScripts(t *testing.T) []luaScript {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	byDir := map[string][]*ast.File{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "vendor" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		byDir[filepath.Dir(path)] = append(byDir[filepath.Dir(path)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every package's constants, by package name and name (script.Now), for scripts
	// built from Lua a package shares with others.
	qualified := map[string]ast.Expr{}
	constsOf := func(files []*ast.File) map[string]ast.Expr {
		consts := map[string]ast.Expr{}
		for _, f := range files {
			for _, d := range f.Decls {
				if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
					for _, s := range g.Specs {
						vs := s.(*ast.ValueSpec)
						for i, n := range vs.Names {
							if i < len(vs.Values) {
								consts[n.Name] = vs.Values[i]
								qualified[f.Name.Name+"."+n.Name] = vs.Values[i]
							}
						}
					}
				}
			}
		}
		return consts
	}
	for _, files := range byDir {
		constsOf(files)
	}
	var out []luaScript
	for _, files := range byDir {
		consts := constsOf(files)
		var eval func(e ast.Expr) (string, bool)
		eval = func(e ast.Expr) (string, bool) {
			switch e := e.(type) {
			case *ast.BasicLit:
				s, err := strconv.Unquote(e.Value)
				return s, err == nil
			case *ast.Ident:
				if c, ok := consts[e.Name]; ok {
					return eval(c)
				}
			case *ast.BinaryExpr:
				if e.Op == token.ADD {
					a, ok1 := eval(e.X)
					b, ok2 := eval(e.Y)
					return a + b, ok1 && ok2
				}
			case *ast.ParenExpr:
				return eval(e.X)
			case *ast.SelectorExpr:
				if pkg, ok := e.X.(*ast.Ident); ok {
					if c, ok := qualified[pkg.Name+"."+e.Sel.Name]; ok {
						return eval(c)
					}
				}
			}
			return "", false
		}
		for _, f := range files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.VAR {
					continue
				}
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, v := range vs.Values {
						call, ok := v.(*ast.CallExpr)
						if !ok || len(call.Args) != 1 {
							continue
						}
						sel, ok := call.Fun.(*ast.SelectorExpr)
						if !ok || sel.Sel.Name != "NewScript" {
							continue
						}
						where := fset.Position(call.Pos()).String()
						src, ok := eval(call.Args[0])
						if !ok {
							t.Errorf("%s: cannot read the script's source statically", where)
							continue
						}
						doc := vs.Doc
						if doc == nil {
							doc = g.Doc
						}
						out = append(out, luaScript{where: where, name: vs.Names[i].Name, doc: doc.Text(), src: src})
					}
				}
			}
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d scripts: the scan is broken", len(out))
	}
	return out
}

var (
	luaComment = regexp.MustCompile(`--[^\n]*`)
	luaLocal   = regexp.MustCompile(`local\s+([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*=\s*([^\n]+)`)
	luaKeysArg = regexp.MustCompile(`^KEYS\[[^\]]+\]$`)
	// commands whose first argument is not a key
	keylessCommands = map[string]bool{"time": true, "ping": true, "info": true}
)

// splitArgs splits s at top-level commas up to the parenthesis closing the call that
// starts at s[0] (just after its "("), skipping over string literals.
func splitArgs(s string) []string {
	var args []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'', '"':
			for i++; i < len(s) && s[i] != c; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case '(', '{', '[':
			depth++
		case ')', '}', ']':
			if depth == 0 {
				return append(args, strings.TrimSpace(s[start:i]))
			}
			depth--
		case ',':
			if depth == 0 {
				args = append(args, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return args
}

// A Lua script must name every key it touches in KEYS (Redis Cluster routes a call by
// them, and a key built inside the script escapes that), and its header comment must
// say what its KEYS and ARGV hold.
func TestScriptsTouchOnlyDeclaredKeys(t *testing.T) {
	for _, s := range moduleScripts(t) {
		src := luaComment.ReplaceAllString(s.src, "")
		keyAliases := map[string]bool{}
		callNames := []string{`redis\.call`, `redis\.pcall`}
		for _, m := range luaLocal.FindAllStringSubmatch(src, -1) {
			names := strings.Split(m[1], ",")
			exprs := splitArgs(m[2] + ")")
			for i, n := range names {
				n = strings.TrimSpace(n)
				if i >= len(exprs) {
					break
				}
				switch e := exprs[i]; {
				case luaKeysArg.MatchString(e):
					keyAliases[n] = true
				case e == "redis.call" || e == "redis.pcall":
					callNames = append(callNames, regexp.QuoteMeta(n))
				}
			}
		}
		calls := regexp.MustCompile(`(?:^|[^A-Za-z0-9_.])(?:` + strings.Join(callNames, "|") + `)\s*\(`)
		for _, loc := range calls.FindAllStringIndex(src, -1) {
			args := splitArgs(src[loc[1]:])
			if len(args) == 0 {
				continue
			}
			cmd, err := strconv.Unquote(strings.ReplaceAll(args[0], "'", `"`))
			if err != nil {
				t.Errorf("%s (%s): redis command %s is not a literal", s.name, s.where, args[0])
				continue
			}
			if keylessCommands[strings.ToLower(cmd)] || len(args) < 2 {
				continue
			}
			if key := args[1]; !luaKeysArg.MatchString(key) && !keyAliases[key] {
				t.Errorf("%s (%s): %s on %q, which is not KEYS[…] or a local taken from KEYS", s.name, s.where, cmd, key)
			}
		}
		if strings.Contains(src, "KEYS[") && !strings.Contains(s.doc, "KEYS") {
			t.Errorf("%s (%s): uses KEYS but its comment does not say what they hold", s.name, s.where)
		}
		if strings.Contains(src, "ARGV[") && !strings.Contains(s.doc, "ARGV") {
			t.Errorf("%s (%s): uses ARGV but its comment does not say what they hold", s.name, s.where)
		}
	}
}
