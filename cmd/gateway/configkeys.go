package main

// This file checks each configuration source (the YAML file, the
// SWITCHBOARD_* environment) on its own, before the layered decode, so an
// error names a key the way the operator wrote it, in the file or as a
// variable, suggests the nearest valid key for a misspelling, and explains
// a bad value without Go type names. The valid keys come from the koanf
// struct tags by reflection, so a key added to a config struct is known
// here at once; the values are tried with the decoder configuration the
// real decode uses, so both accept exactly the same input.

import (
	"encoding"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
)

// decoderConfig is the mapstructure configuration of the configuration
// decode, shared by the real decode and the per-value checks: durations in
// Go syntax ("30s"), comma-separated strings for []string (the only way to
// give a list from the environment), encoding.TextUnmarshaler types, and
// weakly typed input (the string "8" for a number, "true" for a bool, as
// every environment value is a string). koanf sets the tag name and the
// result; the caller adds ErrorUnused when it wants it.
func decoderConfig() *mapstructure.DecoderConfig {
	return &mapstructure.DecoderConfig{
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			strictNumbers,
			mapstructure.StringToTimeDurationHookFunc(),
			stringToList,
			mapstructure.TextUnmarshallerHookFunc()),
		WeaklyTypedInput: true,
	}
}

// errNeedsUnit and errNotWhole are returned by strictNumbers; valueProblem
// turns them into the operator's message.
var (
	errNeedsUnit = errors.New("a duration needs its unit")
	errNotWhole  = errors.New("not a whole number")
)

// strictNumbers refuses what weak typing would silently change: a bare
// number for a duration (YAML's `idle: 30` would be 30 ns; only 0 is
// allowed without a unit) and a fraction for a whole number (2.7 would be
// 2).
func strictNumbers(from, to reflect.Type, v any) (any, error) {
	rv := reflect.ValueOf(v)
	switch {
	case to == durationType && rv.CanInt() && rv.Int() != 0,
		to == durationType && rv.CanUint() && rv.Uint() != 0,
		to == durationType && rv.CanFloat() && rv.Float() != 0:
		return nil, errNeedsUnit
	case to != durationType && isIntKind(to.Kind()) && rv.CanFloat() && rv.Float() != math.Trunc(rv.Float()):
		return nil, errNotWhole
	}
	return v, nil
}

func isIntKind(k reflect.Kind) bool {
	return k >= reflect.Int && k <= reflect.Uint64
}

// stringToList splits a string given for a list (every list set from the
// environment) at commas, trimming spaces around each item and one pair of
// enclosing brackets: "a,b", "a, b" and "[a, b]" are all [a b]; "" is the
// empty list.
func stringToList(from, to reflect.Type, v any) (any, error) {
	s, ok := v.(string)
	if !ok || from.Kind() != reflect.String || to.Kind() != reflect.Slice {
		return v, nil
	}
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = strings.TrimSpace(s[1 : len(s)-1])
	}
	if s == "" {
		return []string{}, nil
	}
	items := strings.Split(s, ",")
	for i := range items {
		items[i] = strings.TrimSpace(items[i])
	}
	return items, nil
}

// configType is the type every source is checked against.
var configType = reflect.TypeFor[Config]()

// fileErrors checks the data of the YAML file at path (the nested maps
// koanf parsed from it) and returns one error per problem, in key order:
//
//	config file my.yaml: server.timeouts.idel: unknown key (did you mean server.timeouts.idle?)
//	config file my.yaml: engines[1].urll: unknown key (did you mean engines[1].url?)
//	config file my.yaml: server.max_body_bytes: "abc" is not a whole number
func fileErrors(path string, data map[string]any) []error {
	var errs []error
	for _, p := range checkSource(data, false) {
		msg := p.msg
		if len(p.suggest) > 0 {
			msg += " (did you mean " + orList(p.suggest) + "?)"
		}
		errs = append(errs, fmt.Errorf("config file %s: %s: %s", path, p.key, msg))
	}
	return errs
}

// envErrors checks every SWITCHBOARD_* variable of environ ("NAME=value"
// strings, as os.Environ returns them) on its own and returns one error
// per problem, ordered by variable name. A variable is named as written;
// a suggestion is given as a variable too, a bad value with its dotted
// key:
//
//	environment SWITCHBOARD_SERVER__TIMEOUTS__IDEL: unknown key server.timeouts.idel (did you mean SWITCHBOARD_SERVER__TIMEOUTS__IDLE?)
//	environment SWITCHBOARD_SERVER__MAX_BODY_BYTES (server.max_body_bytes): "abc" is not a whole number
func envErrors(environ []string) []error {
	type variable struct{ name, key, value string }
	var vars []variable
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) {
			continue
		}
		if key := envKey(name); key != "" {
			vars = append(vars, variable{name, key, value})
		}
	}
	slices.SortStableFunc(vars, func(a, b variable) int { return strings.Compare(a.name, b.name) })
	var errs []error
	for _, v := range vars {
		for _, p := range checkSource(nest(v.key, v.value), true) {
			if !p.unknown {
				errs = append(errs, fmt.Errorf("environment %s (%s): %s", v.name, p.key, p.msg))
				continue
			}
			// The problem is at a prefix of the variable's key: keep what
			// follows it, so SWITCHBOARD_SERVR__LISTEN suggests
			// SWITCHBOARD_SERVER__LISTEN.
			rest := strings.TrimPrefix(v.key, p.key)
			hint := ""
			if strings.Contains(lastKey(p.key), "_") {
				hint = " (levels are joined by a double underscore: " + envPrefix + "ROUTING__POLICY sets routing.policy)"
			}
			if len(p.suggest) > 0 {
				names := make([]string, len(p.suggest))
				for i, s := range p.suggest {
					names[i] = envName(s + rest)
				}
				hint = " (did you mean " + orList(names) + "?)"
			}
			errs = append(errs, fmt.Errorf("environment %s: unknown key %s%s", v.name, v.key, hint))
		}
	}
	return errs
}

// envKey turns a SWITCHBOARD_* variable name into its config key:
// SWITCHBOARD_SERVER__TIMEOUTS__IDLE is server.timeouts.idle. It returns
// "" for the bare prefix, which the environment provider then ignores.
func envKey(name string) string {
	key := strings.ToLower(strings.TrimPrefix(name, envPrefix))
	return strings.ReplaceAll(key, "__", ".")
}

// envName is envKey in reverse: server.timeouts.idle is
// SWITCHBOARD_SERVER__TIMEOUTS__IDLE.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
}

// nest turns one dotted key and its value into the nested maps koanf
// builds from it: "server.timeouts.idle" becomes
// {server: {timeouts: {idle: v}}}.
func nest(key string, v any) map[string]any {
	parts := strings.Split(key, ".")
	m := map[string]any{parts[len(parts)-1]: v}
	for i := len(parts) - 2; i >= 0; i-- {
		m = map[string]any{parts[i]: m}
	}
	return m
}

// orList joins alternatives for a "did you mean" hint: "a", "a or b",
// "a, b or c".
func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// keyProblem is one problem with one key of one configuration source.
type keyProblem struct {
	// key is the dotted path as written, list items as [i]:
	// "engines[1].urll".
	key string
	// msg says what is wrong, without the key: "unknown key",
	// `"abc" is not a whole number`.
	msg string
	// unknown is set when the key itself does not exist (msg then starts
	// with "unknown key").
	unknown bool
	// suggest holds, for an unknown key, the valid keys it most likely
	// means, in full and dotted, best first; empty when none is close.
	suggest []string
}

// checkSource checks one source's data (nested maps, as koanf holds them)
// against Config and returns its problems in a stable order: keys sorted
// at each level, list items in order, depth first. fromEnv adds hints
// that only make sense for a variable.
func checkSource(data map[string]any, fromEnv bool) []keyProblem {
	c := checker{root: configType, fromEnv: fromEnv}
	c.section("", data, configType, false)
	return c.problems
}

// checker walks one source's data alongside the type it decodes into.
type checker struct {
	root     reflect.Type // the type of the whole source, Config
	fromEnv  bool         // the source is one SWITCHBOARD_* variable
	problems []keyProblem
}

// add records a problem with the value at key.
func (c *checker) add(key, msg string) {
	c.problems = append(c.problems, keyProblem{key: key, msg: msg})
}

// section checks the map m found at path for the struct type t: every key
// must be one of t's, and every value must suit its field. inList is set
// inside an item of a list (engines[i]).
func (c *checker) section(path string, m map[string]any, t reflect.Type, inList bool) {
	fields := sectionKeys(t)
	for _, name := range slices.Sorted(maps.Keys(m)) {
		key := joinKey(path, name)
		ft, ok := fields[name]
		if !ok {
			msg := "unknown key"
			if strings.Contains(name, ".") {
				msg = "unknown key: a key name cannot contain a dot, nest the levels instead"
			}
			c.problems = append(c.problems, keyProblem{key: key, msg: msg, unknown: true,
				suggest: c.suggest(path, name, t, inList)})
			continue
		}
		c.value(key, m[name], ft, inList)
	}
}

// value checks v, found at key, against the Go type t of its field.
func (c *checker) value(key string, v any, t reflect.Type, inList bool) {
	if v == nil {
		// "key:" with nothing after it: the decoder leaves the field alone.
		return
	}
	t = deref(t)
	switch shapeOf(t) {
	case sectionShape:
		m, ok := v.(map[string]any)
		if !ok {
			c.add(key, "expected a section (key: value pairs), got "+describe(v))
			return
		}
		c.section(key, m, t, inList)
	case sectionListShape:
		items, ok := v.([]any)
		if !ok {
			msg := fmt.Sprintf("expected a list of %s, got %s", lastKey(key), describe(v))
			if c.fromEnv {
				msg += "; a list of sections can only be set in the config file"
			}
			c.add(key, msg)
			return
		}
		for i, item := range items {
			c.value(fmt.Sprintf("%s[%d]", key, i), item, t.Elem(), true)
		}
	case mapShape:
		m, ok := v.(map[string]any)
		if !ok {
			c.add(key, "expected a section (key: value pairs), got "+describe(v))
			return
		}
		for _, name := range slices.Sorted(maps.Keys(m)) {
			c.value(joinKey(key, name), m[name], t.Elem(), inList)
		}
	default:
		if items, ok := v.([]any); ok && isList(t) {
			// Check the items one by one, for a precise key.
			for i, item := range items {
				c.value(fmt.Sprintf("%s[%d]", key, i), item, t.Elem(), inList)
			}
			return
		}
		if msg := valueProblem(v, t); msg != "" {
			c.add(key, msg)
		}
	}
}

// keyShape is what a key holds, as an operator sees it.
type keyShape int

const (
	valueShape       keyShape = iota // one value or a list of values: a string, number, bool, duration, []string
	sectionShape                     // a struct: nested key: value pairs with fixed keys
	sectionListShape                 // a slice of structs, such as engines
	mapShape                         // a map: nested key: value pairs with free keys
)

// textUnmarshalerType lets shapeOf treat types such as netip.Prefix as
// single values, as the decode hook does.
var textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()

// shapeOf says what a field of type t holds.
func shapeOf(t reflect.Type) keyShape {
	t = deref(t)
	if reflect.PointerTo(t).Implements(textUnmarshalerType) {
		return valueShape
	}
	switch t.Kind() {
	case reflect.Struct:
		return sectionShape
	case reflect.Map:
		return mapShape
	case reflect.Slice, reflect.Array:
		if shapeOf(t.Elem()) == sectionShape {
			return sectionListShape
		}
	}
	return valueShape
}

// isList reports whether t, a value-shaped type, is a list of values.
func isList(t reflect.Type) bool {
	k := deref(t).Kind()
	return k == reflect.Slice || k == reflect.Array
}

// deref strips pointer types: the decoder allocates them.
func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// sectionKeys maps each key of the struct type t to its field's type, as
// the decoder reads the koanf tags: `koanf:"-"` fields are skipped, the
// fields of a `koanf:",squash"` struct (gateway.Config inside
// ServerConfig) count as t's own, and an exported field without a tag is
// known by its name in lower case (the decoder matches it in any case).
func sectionKeys(t reflect.Type) map[string]reflect.Type {
	keys := make(map[string]reflect.Type)
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if name == "-" {
			continue
		}
		if ft := deref(f.Type); ft.Kind() == reflect.Struct && slices.Contains(strings.Split(opts, ","), "squash") {
			maps.Copy(keys, sectionKeys(ft))
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		keys[name] = f.Type
	}
	return keys
}

// joinKey appends name to the dotted key path.
func joinKey(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// lastKey is the last level of a dotted key: "engines" for "engines".
func lastKey(key string) string {
	return key[strings.LastIndex(key, ".")+1:]
}

// describe shows a value the way the operator wrote it: strings quoted,
// sections and lists by their shape.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case map[string]any:
		return "a section"
	case []any:
		return "a list"
	}
	return fmt.Sprint(v)
}

// goCall matches the Go function an error message may start with, as in
// `netip.ParsePrefix("x"): no '/'`, which an operator need not read.
var goCall = regexp.MustCompile(`^[a-z][a-z0-9]*\.[A-Za-z][A-Za-z0-9]*\(.*?\): `)

// durationType is the type the duration hook parses strings into.
var durationType = reflect.TypeFor[time.Duration]()

// valueProblem says, in the operator's terms, why the decoder rejects v for
// a value-shaped field of type t; it returns "" when v decodes.
func valueProblem(v any, t reflect.Type) string {
	if decodes(v, t) {
		return ""
	}
	switch v.(type) {
	case map[string]any:
		if isList(t) {
			return "expected a list of values, got a section"
		}
		return "expected a single value, got a section"
	case []any:
		return "expected a single value, got a list"
	}
	t = deref(t)
	if isList(t) {
		// A single value is taken as a list of one.
		if msg := valueProblem(v, t.Elem()); msg != "" {
			return msg
		}
		return describe(v) + " is not a valid list"
	}
	got := describe(v)
	switch {
	case t == durationType && isNumber(v):
		n := strings.Trim(got, `"`)
		return got + " is not a duration: give its unit, such as " + n + "s or " + n + "ms"
	case t == durationType:
		return got + " is not a duration (use Go syntax such as 500ms, 30s, 10m)"
	case reflect.PointerTo(t).Implements(textUnmarshalerType):
		if s, ok := v.(string); ok {
			if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
				return fmt.Sprintf("%s is not valid: %s", got, goCall.ReplaceAllString(err.Error(), ""))
			}
		}
		return got + " is not valid"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return got + " is not a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return got + " is not a whole number of 0 or more"
	case reflect.Float32, reflect.Float64:
		return got + " is not a number"
	case reflect.Bool:
		return got + " is not true or false"
	}
	return got + " is not valid here"
}

// isNumber reports whether v is a number, or a string holding one (as
// every value from the environment is).
func isNumber(v any) bool {
	if s, ok := v.(string); ok {
		_, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		return err == nil
	}
	rv := reflect.ValueOf(v)
	return rv.CanInt() || rv.CanUint() || rv.CanFloat()
}

// decodes reports whether the configuration decoder turns v into a value
// of type t.
func decodes(v any, t reflect.Type) bool {
	dc := decoderConfig()
	dc.Result = reflect.New(t).Interface()
	d, err := mapstructure.NewDecoder(dc)
	if err != nil {
		return false
	}
	return d.Decode(v) == nil
}

// suggest returns the keys an unknown key name, found in the section at
// path of type t, most likely means, in full, best first:
//
//   - the same name in another case: Server is server;
//   - the nearest key of the same section by edit distance, within one
//     edit for names up to 4 characters, two up to 8, three beyond:
//     serverr is server, timeouts.idel is timeouts.idle;
//   - levels joined by an underscore instead of a dot: routing_policy is
//     routing.policy (a SWITCHBOARD_ROUTING_POLICY variable);
//   - outside list items, keys of that name elsewhere, shallowest first:
//     server.policy is routing.policy.
//
// It returns nil when nothing is close.
func (c *checker) suggest(path, name string, t reflect.Type, inList bool) []string {
	fields := sectionKeys(t)
	keys := slices.Sorted(maps.Keys(fields))
	lower := strings.ToLower(name)
	for _, k := range keys {
		if strings.ToLower(k) == lower {
			return []string{joinKey(path, k)}
		}
	}
	if best := nearest(lower, keys); best != "" {
		return []string{joinKey(path, best)}
	}
	if p, ok := splitLevels(t, lower); ok {
		return []string{joinKey(path, p)}
	}
	if inList {
		// An engine setting that does not exist is rarely a global one.
		return nil
	}
	var found []string
	keysNamed(c.root, "", lower, &found)
	slices.SortStableFunc(found, func(a, b string) int {
		return strings.Count(a, ".") - strings.Count(b, ".")
	})
	return found[:min(len(found), 3)]
}

// nearest returns the one of names nearest to name by editDistance, both
// in lower case, within maxEdits(name); the first of equal distance, and
// "" when none is that close. Config keys and flags are suggested by it.
func nearest(name string, names []string) string {
	lower := strings.ToLower(name)
	best, bestDist := "", maxEdits(lower)+1
	for _, n := range names {
		if d := editDistance(lower, strings.ToLower(n)); d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// maxEdits is how many edits a suggestion may be away from name.
func maxEdits(name string) int {
	switch n := len([]rune(name)); {
	case n <= 4:
		return 1
	case n <= 8:
		return 2
	}
	return 3
}

// splitLevels finds the key path below the section type t that name spells
// with underscores where dots belong: "timeouts_idle" in the server
// section is "timeouts.idle".
func splitLevels(t reflect.Type, name string) (string, bool) {
	fields := sectionKeys(t)
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		rest, ok := strings.CutPrefix(name, k+"_")
		ft := deref(fields[k])
		if !ok || shapeOf(ft) != sectionShape {
			continue
		}
		if _, ok := sectionKeys(ft)[rest]; ok {
			return k + "." + rest, true
		}
		if p, ok := splitLevels(ft, rest); ok {
			return k + "." + p, true
		}
	}
	return "", false
}

// keysNamed appends to found the full path of every key called name in
// the section type t at path and the sections below it (not inside lists
// or maps), in key order.
func keysNamed(t reflect.Type, path, name string, found *[]string) {
	fields := sectionKeys(t)
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		key := joinKey(path, k)
		if strings.ToLower(k) == name {
			*found = append(*found, key)
		}
		if ft := deref(fields[k]); shapeOf(ft) == sectionShape {
			keysNamed(ft, key, name, found)
		}
	}
}

// editDistance is the optimal string alignment distance between a and b:
// the insertions, deletions, substitutions and swaps of two adjacent
// characters that turn one into the other ("idel" to "idle" is one swap).
func editDistance(a, b string) int {
	s, t := []rune(a), []rune(b)
	// d[i][j] is the distance between s[:i] and t[:j].
	d := make([][]int, len(s)+1)
	for i := range d {
		d[i] = make([]int, len(t)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(s); i++ {
		for j := 1; j <= len(t); j++ {
			cost := 1
			if s[i-1] == t[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && s[i-1] == t[j-2] && s[i-2] == t[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(s)][len(t)]
}
