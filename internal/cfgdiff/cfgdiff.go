// Package cfgdiff compares and merges two configuration structs key by key,
// the keys named as their koanf tags name them in the YAML file, so a
// reload can say which settings changed and keep those it cannot apply.
package cfgdiff

import (
	"reflect"
	"strings"
)

// Diff appends to keys the dotted key of every field of a and b (structs
// of the same type) whose values differ, in field order, recursing into
// struct fields. A key is prefix, a dot and the field's koanf tag name
// (the name alone when prefix is ""). Fields tagged "-" and unexported
// fields are not compared, nor is any field for which skip (when not nil)
// reports true, given its key and its koanf tag options ("squash", ...).
// An empty slice equals a nil one.
func Diff(prefix string, a, b reflect.Value, skip func(key, opts string) bool, keys *[]string) {
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		fa, fb := a.Field(i), b.Field(i)
		switch {
		case skip != nil && skip(key, opts):
		case f.Type.Kind() == reflect.Struct:
			Diff(key, fa, fb, skip, keys)
		case f.Type.Kind() == reflect.Slice && fa.Len() == 0 && fb.Len() == 0:
		case !reflect.DeepEqual(fa.Interface(), fb.Interface()):
			*keys = append(*keys, key)
		}
	}
}

// Keep sets every field of next (a settable struct) to its value in
// running unless apply reports its key as one a reload applies, recursing
// into struct fields whose own key is not applied whole; keys are named as
// in Diff, and fields tagged "-" and unexported fields are left alone.
func Keep(prefix string, next, running reflect.Value, apply func(key string) bool) {
	t := next.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		switch {
		case apply(key):
		case f.Type.Kind() == reflect.Struct:
			Keep(key, next.Field(i), running.Field(i), apply)
		default:
			next.Field(i).Set(running.Field(i))
		}
	}
}
