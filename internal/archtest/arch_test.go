// Package archtest enforces the module's import rules: which of its packages may
// depend on which. It holds only this test.
package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A rule forbids the packages matching subject to import the packages matching any
// of forbidden. Names are paths relative to the module; "" is the module's root
// package alone, any other name also covers its subpackages ("cmd" covers
// "cmd/agentq").
type rule struct {
	subject   string
	forbidden []string
	// direct rules look at a package's own imports only; the others at everything it
	// depends on, however indirectly, so a rule cannot be bypassed through a third
	// package.
	direct bool
	// optional: the subject need not exist (yet).
	optional bool
	why      string
}

var rules = []rule{
	{subject: "quotas", forbidden: []string{"", "web", "scheduler", "runtime", "billing", "cmd"},
		why: "limits are a leaf"},
	{subject: "scheduler", forbidden: []string{"", "web", "runtime", "billing", "cmd"},
		why: "the scheduler knows queues and slots, not the services around it"},
	{subject: "runtime", forbidden: []string{"", "web", "cmd"},
		why: "the worker runtime does not depend on the API or the library that assembles it"},
	{subject: "billing", forbidden: []string{"", "web", "scheduler", "cmd"}, optional: true,
		why: "billing does not depend on the API, the scheduler or the library"},
	{subject: "internal/maintenance", forbidden: []string{"", "web", "runtime", "billing", "cmd"},
		why: "the maintenance passes get their services from the library, they do not import it"},
	{subject: "internal/pg", forbidden: infraForbidden, why: "infrastructure packages are leaves"},
	{subject: "internal/redisx", forbidden: infraForbidden, why: "infrastructure packages are leaves"},
	{subject: "internal/rkeys", forbidden: infraForbidden, why: "infrastructure packages are leaves"},
	{subject: "internal/config", forbidden: infraForbidden, why: "infrastructure packages are leaves"},
	{subject: "web", forbidden: []string{"internal/store"}, direct: true,
		why: "HTTP handlers go through the domain services, not the store"},
	{subject: "cmd", forbidden: []string{"internal/store"}, direct: true,
		why: "the CLI goes through the domain services, not the store"},
}

var infraForbidden = []string{"", "web", "scheduler", "runtime", "quotas", "billing", "cmd"}

// knownViolations are today's breaches of the rules, as "package -> import", allowed
// until the code that causes them moves. The test fails when one of them disappears,
// so that it is deleted here and cannot come back unnoticed.
var knownViolations = map[string]bool{}

// pkg is the part of `go list -json` this test reads.
type pkg struct {
	ImportPath string
	Imports    []string
	Standard   bool
	Module     *struct {
		Path string
		Main bool
	}
	Error *struct{ Err string }
}

// graph is the module's packages, by path relative to the module, with their
// imports (relative for the module's own packages, full for the others).
type graph struct {
	module   string
	own      map[string][]string
	standard map[string]bool
}

func load(t *testing.T) graph {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == "/dev/null" {
		t.Fatal("go env GOMOD: not inside a module")
	}
	cmd := exec.Command("go", "list", "-deps", "-json", "./...")
	cmd.Dir = filepath.Dir(gomod)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var all []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		all = append(all, p)
	}
	g := graph{own: map[string][]string{}, standard: map[string]bool{}}
	for _, p := range all {
		if p.Module != nil && p.Module.Main {
			g.module = p.Module.Path
		}
		g.standard[p.ImportPath] = p.Standard
	}
	if g.module == "" {
		t.Fatal("go list listed no package of the main module")
	}
	for _, p := range all {
		if p.Module == nil || !p.Module.Main {
			continue
		}
		imports := make([]string, 0, len(p.Imports))
		for _, imp := range p.Imports {
			imports = append(imports, g.rel(imp))
		}
		g.own[g.rel(p.ImportPath)] = imports
	}
	return g
}

// rel is path relative to the module ("" for its root), or path itself for a package
// outside the module.
func (g graph) rel(path string) string {
	if path == g.module {
		return ""
	}
	if r, ok := strings.CutPrefix(path, g.module+"/"); ok {
		return r
	}
	return path
}

func (g graph) isOwn(rel string) bool { _, ok := g.own[rel]; return ok }

// covers reports whether name (a rule's package name) covers the package rel.
func covers(name, rel string) bool {
	if name == "" {
		return rel == ""
	}
	return rel == name || strings.HasPrefix(rel, name+"/")
}

// show names a relative path in messages.
func show(rel string) string {
	if rel == "" {
		return "(root)"
	}
	return rel
}

// chain is the shortest import chain from one own package to another, or nil.
func (g graph) chain(from, to string) []string {
	prev := map[string]string{from: from}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var c []string
			for ; p != from; p = prev[p] {
				c = append(c, p)
			}
			c = append(c, from)
			slices.Reverse(c)
			return c
		}
		for _, imp := range g.own[p] {
			if _, seen := prev[imp]; !seen && g.isOwn(imp) {
				prev[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

// violations checks every rule and returns the breaches, "package -> import" with
// its explanation.
func (g graph) violations(t *testing.T) map[string]string {
	t.Helper()
	found := map[string]string{}
	pkgs := make([]string, 0, len(g.own))
	for p := range g.own {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, r := range rules {
		matched := false
		for _, p := range pkgs {
			if !covers(r.subject, p) {
				continue
			}
			matched = true
			for _, target := range pkgs {
				if target == p || !slices.ContainsFunc(r.forbidden, func(f string) bool { return covers(f, target) }) {
					continue
				}
				var c []string
				if r.direct {
					if slices.Contains(g.own[p], target) {
						c = []string{p, target}
					}
				} else {
					c = g.chain(p, target)
				}
				if c == nil {
					continue
				}
				names := make([]string, len(c))
				for i, s := range c {
					names[i] = show(s)
				}
				found[show(p)+" -> "+show(target)] = r.why + " (imports: " + strings.Join(names, " -> ") + ")"
			}
		}
		if !matched && !r.optional {
			t.Errorf("rule for %q matches no package: the package moved; update the rule", r.subject)
		}
	}
	// Only cmd imports cmd.
	for _, p := range pkgs {
		for _, imp := range g.own[p] {
			if covers("cmd", imp) && !covers("cmd", p) {
				found[show(p)+" -> "+imp] = "only cmd/... imports cmd/..."
			}
		}
	}
	// client is what other programs import to talk to agentq: the standard library
	// only. agentqtype is the vocabulary every layer shares, so it depends on none
	// (its generator, a subpackage, may import it).
	for _, p := range pkgs {
		var why string
		switch {
		case covers("client", p):
			why = "the client imports only the standard library"
		case p == "agentqtype":
			why = "agentqtype imports only the standard library"
		default:
			continue
		}
		for _, imp := range g.own[p] {
			if !g.standard[imp] {
				found[show(p)+" -> "+imp] = why
			}
		}
	}
	// quotas itself holds the limits' words, which the SQL layer, the tenant service and
	// the API name: it knows no Redis (its machinery is in quotas/admission and
	// quotas/capacity), however indirectly.
	for _, imp := range g.externalDeps("quotas") {
		for _, redis := range redisClients {
			if covers(redis, imp) {
				found["quotas -> "+imp] = "the limits' words know no Redis; the machinery is in quotas/admission and quotas/capacity"
			}
		}
	}
	return found
}

// redisClients are the Redis client modules.
var redisClients = []string{"github.com/redis/go-redis", "github.com/hibiken/asynq"}

// externalDeps are the packages outside the module that rel depends on through the
// module's own packages (rel included), sorted.
func (g graph) externalDeps(rel string) []string {
	seen := map[string]bool{rel: true}
	queue := []string{rel}
	var out []string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g.own[p] {
			if seen[imp] {
				continue
			}
			seen[imp] = true
			if g.isOwn(imp) {
				queue = append(queue, imp)
			} else if !g.standard[imp] {
				out = append(out, imp)
			}
		}
	}
	slices.Sort(out)
	return out
}

func TestImportRules(t *testing.T) {
	g := load(t)
	if !g.isOwn("quotas") || !g.isOwn("web") {
		t.Fatalf("go list found none of the module's packages (%d listed)", len(g.own))
	}
	found := g.violations(t)
	keys := make([]string, 0, len(found))
	for v := range found {
		keys = append(keys, v)
	}
	slices.Sort(keys)
	for _, v := range keys {
		if !knownViolations[v] {
			t.Errorf("forbidden import %s: %s", v, found[v])
		}
	}
	known := make([]string, 0, len(knownViolations))
	for v := range knownViolations {
		known = append(known, v)
	}
	slices.Sort(known)
	for _, v := range known {
		if _, ok := found[v]; !ok {
			t.Errorf("known violation %q is gone: delete it from knownViolations", v)
		}
	}
}

// The rule matcher itself: a subpackage is covered by its parent's name, the root
// only by "".
func TestCovers(t *testing.T) {
	for _, c := range []struct {
		name, rel string
		want      bool
	}{
		{"", "", true}, {"", "web", false}, {"web", "web", true}, {"web", "web/admin", true},
		{"web", "webhooks", false}, {"cmd", "cmd/agentq", true}, {"internal/store", "internal/storex", false},
	} {
		if got := covers(c.name, c.rel); got != c.want {
			t.Errorf("covers(%q, %q) = %v, want %v", c.name, c.rel, got, c.want)
		}
	}
}
