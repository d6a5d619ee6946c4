package apispec

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The Go SDK (sdk/go, its own module) is checked against api/openapi.yaml
// here, where both are at hand: the SDK module must not depend on the
// server. Its wire types are mostly unexported (createRequest,
// streamRecord) or local to a method (Client.Pause's out), so the test
// type-checks the SDK's source with go/types rather than using reflect,
// and walks each wire type as encoding/json sees it: json tags, "-",
// embedded structs flattened, pointers, slices, maps, time.Time.

// sdkGoBindings names each SDK wire type and the body of the operation it
// is sent as or decoded from. A type is a package-level type name
// ("createRequest") or a method's local variable ("Client.Pause.out",
// "ExecInfo.UnmarshalJSON.w"). body is "request" or a response status
// ("200", or "error" for the Error response every route can give).
var sdkGoBindings = []struct{ typ, method, path, body string }{
	{"createRequest", "POST", "/v1/sandboxes", "request"},
	{"Client.Create.sb", "POST", "/v1/sandboxes", "201"},
	{"Client.List.out", "GET", "/v1/sandboxes", "200"},
	{"Client.Get.sb", "GET", "/v1/sandboxes/{id}", "200"},
	{"Client.SetTimeout.in", "POST", "/v1/sandboxes/{id}/timeout", "request"},
	{"Client.SetTimeout.sb", "POST", "/v1/sandboxes/{id}/timeout", "200"},
	{"Client.Pause.in", "POST", "/v1/sandboxes/{id}/pause", "request"},
	{"Client.Pause.out", "POST", "/v1/sandboxes/{id}/pause", "200"},
	{"Client.Resume.sb", "POST", "/v1/sandboxes/{id}/resume", "200"},
	{"Client.Usage.u", "GET", "/v1/sandboxes/{id}/usage", "200"},
	{"Client.GetNetwork.out", "GET", "/v1/sandboxes/{id}/network", "200"},
	{"NetworkPolicy", "PUT", "/v1/sandboxes/{id}/network", "request"},
	{"Client.SetNetwork.out", "PUT", "/v1/sandboxes/{id}/network", "200"},
	{"Client.Snapshot.in", "POST", "/v1/sandboxes/{id}/snapshot", "request"},
	{"Client.Snapshot.sn", "POST", "/v1/sandboxes/{id}/snapshot", "201"},
	{"Client.ForkWith.in", "POST", "/v1/sandboxes/{id}/fork", "request"},
	{"Client.ForkWith.out", "POST", "/v1/sandboxes/{id}/fork", "201"},
	{"Client.ListSnapshotsIn.out", "GET", "/v1/snapshots", "200"},
	{"Client.GetSnapshot.sn", "GET", "/v1/snapshots/{name}", "200"},
	{"Client.PruneSnapshots.out", "POST", "/v1/snapshots/prune", "200"},
	{"Client.CreateVolume.in", "POST", "/v1/volumes", "request"},
	{"Client.CreateVolume.v", "POST", "/v1/volumes", "201"},
	{"Client.ListVolumes.out", "GET", "/v1/volumes", "200"},
	{"Client.SetVaultSecret.in", "PUT", "/v1/secrets/{name}", "request"},
	{"Client.SetVaultSecret.out", "PUT", "/v1/secrets/{name}", "200"},
	{"Client.ListVaultSecrets.out", "GET", "/v1/secrets", "200"},
	{"Client.SetSandboxSecret.in", "PUT", "/v1/sandboxes/{id}/secrets/{name}", "request"},
	{"Client.SetSandboxSecret.out", "PUT", "/v1/sandboxes/{id}/secrets/{name}", "200"},
	{"Client.RemoveSandboxSecret.out", "DELETE", "/v1/sandboxes/{id}/secrets/{name}", "200"},
	{"Client.GetVolume.v", "GET", "/v1/volumes/{name}", "200"},
	{"Client.ResizeVolume.in", "POST", "/v1/volumes/{name}/resize", "request"},
	{"Client.ResizeVolume.v", "POST", "/v1/volumes/{name}/resize", "200"},
	{"execRequest", "POST", "/v1/sandboxes/{id}/exec", "request"},
	{"streamRecord", "POST", "/v1/sandboxes/{id}/exec", "200"},
	{"Client.Start.out", "POST", "/v1/sandboxes/{id}/exec", "202"},
	{"streamRecord", "GET", "/v1/sandboxes/{id}/execs/{exec_id}/stream", "200"},
	{"Client.ListExecs.out", "GET", "/v1/sandboxes/{id}/execs", "200"},
	{"Client.GetExec.out", "GET", "/v1/sandboxes/{id}/execs/{exec_id}", "200"},
	{"Client.Signal.in", "POST", "/v1/sandboxes/{id}/execs/{exec_id}/signal", "request"},
	{"codeRequest", "POST", "/v1/sandboxes/{id}/code", "request"},
	{"codeRecord", "POST", "/v1/sandboxes/{id}/code", "200"},
	{"ContextOptions", "POST", "/v1/sandboxes/{id}/contexts", "request"},
	{"Client.CreateContext.out", "POST", "/v1/sandboxes/{id}/contexts", "201"},
	{"Client.ListContexts.out", "GET", "/v1/sandboxes/{id}/contexts", "200"},
	{"Client.RestartContext.out", "POST", "/v1/sandboxes/{id}/contexts/{ctx}/restart", "200"},
	{"Client.writeFile.out", "PUT", "/v1/sandboxes/{id}/files", "200"},
	{"Client.ListFiles.out", "GET", "/v1/sandboxes/{id}/files/list", "200"},
	{"Client.Stat.out", "GET", "/v1/sandboxes/{id}/files/stat", "200"},
	{"Client.Mkdir.in", "POST", "/v1/sandboxes/{id}/files/mkdir", "request"},
	{"Client.WriteArchive.out", "PUT", "/v1/sandboxes/{id}/files/archive", "200"},
	{"Client.Events.out", "GET", "/v1/events", "200"},
	{"decodeError.wire", "GET", "/v1/sandboxes/{id}", "error"},
}

// sdkGoDecoders: SDK types with their own UnmarshalJSON are checked as the
// wire struct that method decodes into. A type that implements
// json.Unmarshaler or json.Marshaler and is not here fails the test.
var sdkGoDecoders = map[string]string{
	"ExecInfo": "ExecInfo.UnmarshalJSON.w", // "exit" decoded into an ExitStatus
	"FileInfo": "FileInfo.UnmarshalJSON.w", // "mode" decoded into an fs.FileMode
}

// sdkGoAllowed are the known, intended differences, each "<Go struct>.<json
// name>" (a struct named by its type, or by its binding and the path to
// it when anonymous) with its reason.
var sdkGoAllowed = map[string]string{
	// One Network/Secret type serves the create request (value, no
	// placeholder read back) and the sandbox the server returns (a
	// placeholder, never a value).
	"Secret.value": "sent on create only; the server never returns a secret's value",
}

// sdkGoIgnoredImports may fail to import while type-checking the SDK (the
// test has export data for the standard library only); what uses them is
// not JSON in the spec.
var sdkGoIgnoredImports = []string{
	"github.com/coder/websocket", // terminal.go: the pty WebSocket
}

// sdkDir finds sdk/go from the test's working directory.
func sdkDir(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for range 6 {
		p := filepath.Join(dir, "sdk", "go")
		if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
			return p
		}
		dir = filepath.Dir(dir)
	}
	t.Fatal("sdk/go not found above the working directory")
	return ""
}

// sdkGoTypes type-checks the Go SDK and returns its wire types by name:
// package-level types and the local variables of each function.
func sdkGoTypes(t *testing.T) (*types.Package, map[string]types.Type) {
	t.Helper()
	dir := sdkDir(t)
	fset := token.NewFileSet()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	var errs []string
	conf := types.Config{
		Importer: importer.Default(),
		Error: func(err error) {
			for _, p := range sdkGoIgnoredImports {
				if strings.Contains(err.Error(), "could not import "+p+" ") {
					return
				}
			}
			errs = append(errs, err.Error())
		},
	}
	info := &types.Info{Defs: map[*ast.Ident]types.Object{}}
	pkg, _ := conf.Check("airlock", fset, files, info)
	if len(errs) > 0 {
		t.Fatalf("type-check sdk/go:\n%s", strings.Join(errs, "\n"))
	}
	out := map[string]types.Type{}
	for _, name := range pkg.Scope().Names() {
		if tn, ok := pkg.Scope().Lookup(name).(*types.TypeName); ok {
			out[name] = tn.Type()
		}
	}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			prefix := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				rt := fd.Recv.List[0].Type
				if s, ok := rt.(*ast.StarExpr); ok {
					rt = s.X
				}
				if id, ok := rt.(*ast.Ident); ok {
					prefix = id.Name + "." + prefix
				}
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok {
					if v, ok := info.Defs[id].(*types.Var); ok && !v.IsField() {
						out[prefix+"."+id.Name] = v.Type()
					}
				}
				return true
			})
		}
	}
	return pkg, out
}

// specDoc is api/openapi.yaml, parsed.
func specDoc(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(specFile())
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// bodySchema is the JSON schema of an operation's request body or of one
// of its responses.
func bodySchema(doc map[string]any, method, path, body string) (any, error) {
	paths, _ := doc["paths"].(map[string]any)
	item, _ := paths[path].(map[string]any)
	op, _ := item[strings.ToLower(method)].(map[string]any)
	if op == nil {
		return nil, fmt.Errorf("%s %s is not in the spec", method, path)
	}
	var holder map[string]any
	switch body {
	case "request":
		holder, _ = op["requestBody"].(map[string]any)
	case "error":
		holder = resolveRef(doc, map[string]any{"$ref": "#/components/responses/Error"}).(map[string]any)
	default:
		rs, _ := op["responses"].(map[string]any)
		holder, _ = resolveRef(doc, rs[body]).(map[string]any)
	}
	content, _ := holder["content"].(map[string]any)
	for _, mt := range []string{"application/json", "application/x-ndjson"} {
		if c, ok := content[mt].(map[string]any); ok {
			return c["schema"], nil
		}
	}
	return nil, fmt.Errorf("%s %s %s: no JSON body in the spec", method, path, body)
}

// resolveRef follows $ref (to components) until a schema without one.
func resolveRef(doc map[string]any, s any) any {
	for range 16 {
		m, ok := s.(map[string]any)
		if !ok {
			return s
		}
		ref, ok := m["$ref"].(string)
		if !ok {
			return s
		}
		var cur any = doc
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cm, _ := cur.(map[string]any)
			cur = cm[part]
		}
		s = cur
	}
	return s
}

// schemaProps returns the properties of object schema s, allOf merged.
func schemaProps(doc map[string]any, s map[string]any) map[string]any {
	props := map[string]any{}
	if ps, ok := s["properties"].(map[string]any); ok {
		for k, v := range ps {
			props[k] = v
		}
	}
	if parts, ok := s["allOf"].([]any); ok {
		for _, p := range parts {
			if pm, ok := resolveRef(doc, p).(map[string]any); ok {
				for k, v := range schemaProps(doc, pm) {
					props[k] = v
				}
			}
		}
	}
	return props
}

// jsonField is one field of a Go struct as encoding/json sees it.
type jsonField struct {
	name string
	typ  types.Type
}

// jsonFields lists the fields encoding/json encodes for st: exported,
// not "-", embedded structs flattened (a shallower name wins).
func jsonFields(st *types.Struct) []jsonField {
	var out []jsonField
	seen := map[string]bool{}
	level := []*types.Struct{st}
	for len(level) > 0 {
		var next []*types.Struct
		names := map[string]jsonField{}
		for _, s := range level {
			for i := range s.NumFields() {
				f := s.Field(i)
				tag, _ := reflect.StructTag(s.Tag(i)).Lookup("json")
				name, _, _ := strings.Cut(tag, ",")
				if tag == "-" {
					continue
				}
				if f.Embedded() && name == "" {
					ft := f.Type()
					if p, ok := ft.(*types.Pointer); ok {
						ft = p.Elem()
					}
					if es, ok := ft.Underlying().(*types.Struct); ok {
						next = append(next, es)
						continue
					}
				}
				if !f.Exported() {
					continue
				}
				if name == "" {
					name = f.Name()
				}
				if !seen[name] {
					names[name] = jsonField{name, f.Type()}
				}
			}
		}
		for _, f := range names {
			seen[f.name] = true
			out = append(out, f)
		}
		level = next
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

type sdkChecker struct {
	doc   map[string]any
	pkg   *types.Package
	named map[string]types.Type
	used  map[string]bool // allow-list entries that matched
	errs  []string
}

func (c *sdkChecker) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// schemaTypes are the JSON types s allows ("" for any).
func (c *sdkChecker) schemaTypes(s map[string]any) []string {
	if t, ok := s["type"].(string); ok {
		return []string{t}
	}
	if _, ok := s["properties"]; ok {
		return []string{"object"}
	}
	if _, ok := s["allOf"]; ok {
		return []string{"object"}
	}
	if alts, ok := s["oneOf"].([]any); ok {
		var out []string
		for _, a := range alts {
			am, _ := resolveRef(c.doc, a).(map[string]any)
			out = append(out, c.schemaTypes(am)...)
		}
		return out
	}
	return []string{""}
}

// pick returns the alternative of a oneOf schema whose type is want (the
// schema itself when it has no oneOf).
func (c *sdkChecker) pick(s map[string]any, want string) map[string]any {
	alts, ok := s["oneOf"].([]any)
	if !ok {
		return s
	}
	for _, a := range alts {
		am, _ := resolveRef(c.doc, a).(map[string]any)
		if slices.Contains(c.schemaTypes(am), want) {
			return am
		}
	}
	return s
}

func isNamed(t types.Type, pkg, name string) bool {
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == pkg && n.Obj().Name() == name
}

// check compares Go type t, named where by a path, with schema s.
func (c *sdkChecker) check(where string, t types.Type, s any) {
	sm, _ := resolveRef(c.doc, s).(map[string]any)
	if sm == nil {
		c.errorf("%s: no schema", where)
		return
	}
	for {
		p, ok := t.(*types.Pointer)
		if !ok {
			break
		}
		t = p.Elem()
	}
	kinds := c.schemaTypes(sm)
	want := func(k string) bool {
		if slices.Contains(kinds, "") || slices.Contains(kinds, k) || k == "number" && slices.Contains(kinds, "integer") {
			return true
		}
		c.errorf("%s: the SDK has %s (JSON %s), the spec %v", where, t, k, kinds)
		return false
	}
	switch {
	case isNamed(t, "time", "Time"):
		if want("string") && c.pick(sm, "string")["format"] != "date-time" {
			c.errorf("%s: the SDK has a time.Time, the spec a string without format date-time", where)
		}
		return
	case isNamed(t, "encoding/json", "RawMessage"):
		return // any JSON: the SDK decodes it by hand
	}
	if n, ok := t.(*types.Named); ok && n.Obj().Pkg() == c.pkg {
		if dec, ok := sdkGoDecoders[n.Obj().Name()]; ok {
			dt, ok := c.named[dec]
			if !ok {
				c.errorf("%s: decoder type %s not found in the SDK", where, dec)
				return
			}
			c.check(where, dt, s)
			return
		}
		for _, m := range []string{"UnmarshalJSON", "MarshalJSON"} {
			if obj, _, _ := types.LookupFieldOrMethod(types.NewPointer(n), true, c.pkg, m); obj != nil {
				if _, isFunc := obj.(*types.Func); isFunc {
					c.errorf("%s: %s has its own %s: add it to sdkGoDecoders", where, n.Obj().Name(), m)
					return
				}
			}
		}
	}
	switch u := t.Underlying().(type) {
	case *types.Basic:
		switch {
		case u.Info()&types.IsString != 0:
			want("string")
		case u.Info()&types.IsInteger != 0:
			want("integer")
		case u.Info()&types.IsFloat != 0:
			want("number")
		case u.Info()&types.IsBoolean != 0:
			want("boolean")
		default:
			c.errorf("%s: unexpected Go type %s", where, t)
		}
	case *types.Interface:
		// any: whatever the schema says
	case *types.Slice:
		if b, ok := u.Elem().Underlying().(*types.Basic); ok && b.Kind() == types.Byte {
			want("string") // base64
			return
		}
		if want("array") {
			c.check(where+"[]", u.Elem(), c.pick(sm, "array")["items"])
		}
	case *types.Map:
		if !want("object") {
			return
		}
		om := c.pick(sm, "object")
		if ps := schemaProps(c.doc, om); len(ps) > 0 {
			c.errorf("%s: the SDK has a map, the spec an object with properties", where)
			return
		}
		if ap, ok := om["additionalProperties"].(map[string]any); ok {
			c.check(where+"{}", u.Elem(), ap)
		}
	case *types.Struct:
		if !want("object") {
			return
		}
		c.checkStruct(where, t, u, c.pick(sm, "object"))
	default:
		c.errorf("%s: unexpected Go type %s", where, t)
	}
}

func (c *sdkChecker) checkStruct(where string, t types.Type, st *types.Struct, sm map[string]any) {
	owner := where
	if n, ok := t.(*types.Named); ok {
		owner = n.Obj().Name()
	}
	props := schemaProps(c.doc, sm)
	fields := jsonFields(st)
	have := map[string]bool{}
	for _, f := range fields {
		have[f.name] = true
		ps, ok := props[f.name]
		if !ok {
			if c.allowed(owner + "." + f.name) {
				continue
			}
			c.errorf("%s: SDK field %q (%s.%s) is not in the spec", where, f.name, owner, f.name)
			continue
		}
		c.check(where+"."+f.name, f.typ, ps)
	}
	var missing []string
	for p := range props {
		if !have[p] && !c.allowed(owner+"."+p) {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	for _, p := range missing {
		c.errorf("%s: spec property %q is missing from the SDK's %s", where, p, owner)
	}
}

func (c *sdkChecker) allowed(key string) bool {
	if _, ok := sdkGoAllowed[key]; ok {
		c.used[key] = true
		return true
	}
	return false
}

// TestGoSDKMatchesSpec: every field the Go SDK sends or reads is in the
// spec with a compatible type, and every property the spec gives those
// bodies is in the SDK's type, but for sdkGoAllowed.
func TestGoSDKMatchesSpec(t *testing.T) {
	pkg, named := sdkGoTypes(t)
	c := &sdkChecker{doc: specDoc(t), pkg: pkg, named: named, used: map[string]bool{}}
	for _, b := range sdkGoBindings {
		typ, ok := named[b.typ]
		if !ok {
			t.Errorf("SDK type %s not found (renamed? update sdkGoBindings)", b.typ)
			continue
		}
		s, err := bodySchema(c.doc, b.method, b.path, b.body)
		if err != nil {
			t.Error(err)
			continue
		}
		c.check(b.typ+" ("+b.method+" "+b.path+" "+b.body+")", typ, s)
	}
	for _, e := range c.errs {
		t.Error(e)
	}
	for k := range sdkGoAllowed {
		if !c.used[k] {
			t.Errorf("allow-list entry %q matched nothing: remove it", k)
		}
	}
}
