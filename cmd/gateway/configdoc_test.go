package main

import (
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
)

// TestGatewayYAMLDocumentsEveryKey: configs/gateway.yaml, the reference
// every key is documented in, has every key the loader knows (the koanf
// tags of Config, by the same reflection the key checker uses), with the
// engines list's item showing every engine key. A key added to a config
// struct without its line in gateway.yaml fails here.
func TestGatewayYAMLDocumentsEveryKey(t *testing.T) {
	b, err := os.ReadFile("../../configs/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	var walk func(path string, m map[string]any, typ reflect.Type)
	walk = func(path string, m map[string]any, typ reflect.Type) {
		for name, ft := range sectionKeys(typ) {
			key := joinKey(path, name)
			v, ok := m[name]
			if !ok {
				missing = append(missing, key)
				continue
			}
			ft = deref(ft)
			switch {
			case ft.Kind() == reflect.Struct && ft != durationType:
				sub, ok := v.(map[string]any)
				if !ok {
					missing = append(missing, key+" (not a section)")
					continue
				}
				walk(key, sub, ft)
			case ft.Kind() == reflect.Slice && deref(ft.Elem()).Kind() == reflect.Struct:
				items, ok := v.([]any)
				if !ok || len(items) == 0 {
					missing = append(missing, key+"[0] (no example item)")
					continue
				}
				item, ok := items[0].(map[string]any)
				if !ok {
					missing = append(missing, key+"[0] (not a section)")
					continue
				}
				walk(key+"[0]", item, deref(ft.Elem()))
			}
		}
	}
	walk("", doc, configType)
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("configs/gateway.yaml does not document %d key(s):\n%v", len(missing), missing)
	}
}
