package mcp

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// What a snapshot shows of the page's accessibility tree (everything in
// it comes from the page, so every string is capped): one line per node
// that is not ignored, indented by depth, as
//
//	[e12] button "Submit" [disabled]
//
// Nodes with no role of their own (none, presentation, an unnamed
// generic container) are left out and their children move up; text
// that repeats its parent's name is left out.
const (
	maxAXName  = 200 // runes of a name, value or url
	maxAXDepth = 40  // indentation stops growing here
)

// axLine is one line of a snapshot.
type axLine struct {
	depth int
	ref   string // "" for text
	text  string // role "name" and properties
}

// renderAX renders the nodes of an Accessibility.getFullAXTree answer
// (from the subtree of the node for root, if not 0) in at most limit
// bytes. ref names a node's DOM element (called only for lines shown).
// It returns the text and how many lines did not fit.
func renderAX(nodes []*accessibility.Node, root cdp.BackendNodeID, limit int, ref func(cdp.BackendNodeID) string) (string, int) {
	byID := make(map[accessibility.NodeID]*accessibility.Node, len(nodes))
	for _, n := range nodes {
		if n != nil {
			byID[n.NodeID] = n
		}
	}
	var roots []*accessibility.Node
	for _, n := range nodes {
		if n == nil {
			continue
		}
		if root != 0 && n.BackendDOMNodeID == root {
			roots = []*accessibility.Node{n}
			break
		}
		if root == 0 && (n.ParentID == "" || byID[n.ParentID] == nil) {
			roots = append(roots, n)
		}
	}
	type item struct {
		n          *accessibility.Node
		depth      int
		parentName string
	}
	var (
		b       strings.Builder
		omitted int
		seen    = make(map[accessibility.NodeID]bool, len(nodes))
		stack   []item
	)
	for i := len(roots) - 1; i >= 0; i-- {
		stack = append(stack, item{roots[i], 0, ""})
	}
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[it.n.NodeID] { // a hostile or broken tree: no loops
			continue
		}
		seen[it.n.NodeID] = true
		line, shown := axNodeLine(it.n, it.parentName)
		depth, name := it.depth, it.parentName
		if shown {
			d := min(depth, maxAXDepth)
			need := len(formatAXLine(axLine{depth: d, text: line.text}))
			if line.ref != "" {
				need += len(refPlaceholder)
			}
			// Once a line does not fit, none after it is shown: the
			// lines shown are a tree's prefix.
			if omitted == 0 && b.Len()+need <= limit {
				if line.ref != "" {
					line.ref = ref(it.n.BackendDOMNodeID)
				}
				line.depth = d
				b.WriteString(formatAXLine(line))
			} else {
				omitted++
			}
			depth++
			name = axName(it.n)
		}
		for i := len(it.n.ChildIDs) - 1; i >= 0; i-- {
			if c := byID[it.n.ChildIDs[i]]; c != nil && !seen[c.NodeID] {
				stack = append(stack, item{c, depth, name})
			}
		}
	}
	return b.String(), omitted
}

// refPlaceholder is the room a line keeps for its ref.
const refPlaceholder = "[e1000000] "

func formatAXLine(l axLine) string {
	var b strings.Builder
	b.WriteString(strings.Repeat("  ", l.depth))
	if l.ref != "" {
		b.WriteString("[" + l.ref + "] ")
	}
	b.WriteString(l.text)
	b.WriteByte('\n')
	return b.String()
}

// axNodeLine is n's line, or false if n is not shown.
func axNodeLine(n *accessibility.Node, parentName string) (axLine, bool) {
	if n.Ignored {
		return axLine{}, false
	}
	role, name := axString(n.Role), axName(n)
	switch role {
	case "", "none", "presentation", "InlineTextBox", "LineBreak":
		return axLine{}, false
	case "generic", "GenericContainer":
		if name == "" {
			return axLine{}, false
		}
	case "StaticText":
		if name == "" || name == parentName {
			return axLine{}, false
		}
		return axLine{text: "text " + strconv.Quote(name)}, true
	}
	var b strings.Builder
	b.WriteString(capRunes(role, 40))
	if name != "" {
		b.WriteString(" " + strconv.Quote(name))
	}
	if v := oneLine(axString(n.Value)); v != "" {
		b.WriteString(" value=" + strconv.Quote(capRunes(v, maxAXName)))
	}
	for _, p := range n.Properties {
		if p == nil {
			continue
		}
		v := axString(p.Value)
		switch p.Name {
		case accessibility.PropertyNameFocused, accessibility.PropertyNameDisabled, accessibility.PropertyNameRequired,
			accessibility.PropertyNameSelected, accessibility.PropertyNameReadonly, accessibility.PropertyNameModal:
			if v == "true" {
				b.WriteString(" [" + string(p.Name) + "]")
			}
		case accessibility.PropertyNameChecked, accessibility.PropertyNamePressed:
			switch v {
			case "true":
				b.WriteString(" [" + string(p.Name) + "]")
			case "mixed":
				b.WriteString(" [" + string(p.Name) + "=mixed]")
			}
		case accessibility.PropertyNameExpanded:
			switch v {
			case "true":
				b.WriteString(" [expanded]")
			case "false":
				b.WriteString(" [collapsed]")
			}
		case accessibility.PropertyNameLevel:
			if _, err := strconv.Atoi(v); err == nil {
				b.WriteString(" [level=" + v + "]")
			}
		case accessibility.PropertyNameURL:
			if u := oneLine(v); u != "" && role == "link" {
				b.WriteString(" url=" + strconv.Quote(capRunes(u, maxAXName)))
			}
		}
	}
	l := axLine{text: b.String()}
	if n.BackendDOMNodeID != 0 {
		l.ref = "-" // named by renderAX if shown
	}
	return l, true
}

// axName is n's accessible name on one line, capped.
func axName(n *accessibility.Node) string {
	return capRunes(oneLine(axString(n.Name)), maxAXName)
}

// axString is v's value as text: a JSON string's content, else the JSON.
func axString(v *accessibility.Value) string {
	if v == nil || len(v.Value) == 0 {
		return ""
	}
	var s string
	if err := json.Unmarshal(v.Value, &s); err == nil {
		return s
	}
	return string(v.Value)
}

// oneLine folds runs of white space (newlines too) into one space.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
}

// capRunes cuts s to n runes, marking the cut with "…".
func capRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// parseRef reads a ref from a snapshot: e12, or [e12] as shown.
func parseRef(s string) (string, error) {
	s = strings.TrimSpace(s)
	if inner, ok := strings.CutPrefix(s, "["); ok {
		s = strings.TrimSuffix(inner, "]")
		if len(s) == len(inner) {
			s = "[" + s // unbalanced
		}
	}
	if len(s) < 2 || len(s) > 10 || s[0] != 'e' {
		return "", fmt.Errorf("%w: ref %q is not a ref of browser_snapshot (like e12)", errdefs.ErrInvalid, capRunes(s, 40))
	}
	n, err := strconv.Atoi(s[1:])
	if err != nil || n < 1 || strconv.Itoa(n) != s[1:] {
		return "", fmt.Errorf("%w: ref %q is not a ref of browser_snapshot (like e12)", errdefs.ErrInvalid, capRunes(s, 40))
	}
	return s, nil
}

// keyNames are the DOM key names chromedp's kb package knows (ArrowDown,
// Enter, F5, ...), lower case, with a few aliases.
var keyNames = func() map[string]rune {
	m := map[string]rune{}
	for r, k := range kb.Keys {
		if k != nil && utf8.RuneCountInString(k.Key) > 1 {
			if old, ok := m[strings.ToLower(k.Key)]; !ok || r < old {
				m[strings.ToLower(k.Key)] = r
			}
		}
	}
	for alias, key := range map[string]string{"esc": "escape", "return": "enter", "del": "delete", "up": "arrowup", "down": "arrowdown", "left": "arrowleft", "right": "arrowright", "pgup": "pageup", "pgdown": "pagedown"} {
		if r, ok := m[key]; ok {
			m[alias] = r
		}
	}
	m["space"] = ' '
	return m
}()

var modifierNames = map[string]chromedp.Modifier{
	"control": chromedp.ModifierCtrl, "ctrl": chromedp.ModifierCtrl, "controlormeta": chromedp.ModifierCtrl,
	"alt": chromedp.ModifierAlt, "option": chromedp.ModifierAlt,
	"shift": chromedp.ModifierShift,
	"meta":  chromedp.ModifierMeta, "cmd": chromedp.ModifierMeta, "command": chromedp.ModifierMeta,
}

// parseKey reads a key press like "Enter", "a", "Control+A" or
// "Shift+Tab" into the rune chromedp's kb encodes and its modifiers.
func parseKey(s string) (rune, []chromedp.Modifier, error) {
	bad := func(why string) (rune, []chromedp.Modifier, error) {
		return 0, nil, fmt.Errorf("%w: key %q: %s (e.g. Enter, Tab, ArrowDown, PageDown, Escape, a, Control+A, Shift+Tab)", errdefs.ErrInvalid, capRunes(s, 40), why)
	}
	if s == "" || len(s) > 64 {
		return bad("give one key, optionally with modifiers")
	}
	parts := strings.Split(s, "+")
	if strings.HasSuffix(s, "++") || s == "+" { // the key "+" itself
		parts = append(parts[:len(parts)-2], "+")
	}
	key := parts[len(parts)-1]
	var mods []chromedp.Modifier
	shift := false
	for _, p := range parts[:len(parts)-1] {
		m, ok := modifierNames[strings.ToLower(strings.TrimSpace(p))]
		if !ok {
			return bad("unknown modifier " + strconv.Quote(capRunes(p, 20)))
		}
		if !slices.Contains(mods, m) {
			mods = append(mods, m)
		}
		shift = shift || m == chromedp.ModifierShift
	}
	var r rune
	switch n := utf8.RuneCountInString(key); {
	case n == 1:
		r, _ = utf8.DecodeRuneInString(key)
		if !unicode.IsPrint(r) {
			return bad("not a printable character")
		}
		// kb's upper-case letters carry Shift: Control+A is Control and a.
		if unicode.IsLetter(r) && len(mods) > 0 {
			if shift {
				r = unicode.ToUpper(r)
				mods = slices.DeleteFunc(mods, func(m chromedp.Modifier) bool { return m == chromedp.ModifierShift })
			} else {
				r = unicode.ToLower(r)
			}
		}
	case n > 1:
		var ok bool
		if r, ok = keyNames[strings.ToLower(key)]; !ok {
			return bad("unknown key name")
		}
	default:
		return bad("no key after the modifiers")
	}
	return r, mods, nil
}
