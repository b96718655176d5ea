// Package cfgdiff compares two configuration structs key by key, the keys
// named as their koanf tags name them in the YAML file, so a reload can say
// which settings changed.
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
