package cfgdiff

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

type inner struct {
	Idle  time.Duration `koanf:"idle"`
	Names []string      `koanf:"names"`
}

type outer struct {
	Listen  string `koanf:"listen"`
	Inner   inner  `koanf:"timeouts"`
	Skipped int    `koanf:"-"`
	Flat    inner  `koanf:"flat,squash"`
	hidden  int
}

func TestDiff(t *testing.T) {
	a := outer{Listen: ":1", Inner: inner{Idle: time.Second, Names: nil}, Skipped: 1, hidden: 1}
	b := outer{Listen: ":2", Inner: inner{Idle: 2 * time.Second, Names: []string{}}, Skipped: 2, hidden: 2, Flat: inner{Idle: 1}}
	var keys []string
	Diff("server", reflect.ValueOf(a), reflect.ValueOf(b), nil, &keys)
	if want := []string{"server.listen", "server.timeouts.idle", "server.flat.idle"}; !slices.Equal(keys, want) {
		t.Errorf("Diff = %v, want %v (nil and empty lists equal; - and unexported fields skipped)", keys, want)
	}
	keys = nil
	Diff("", reflect.ValueOf(a), reflect.ValueOf(b), func(key, opts string) bool { return opts == "squash" || key == "listen" }, &keys)
	if want := []string{"timeouts.idle"}; !slices.Equal(keys, want) {
		t.Errorf("Diff with skip = %v, want %v", keys, want)
	}
}

func TestKeep(t *testing.T) {
	running := outer{Listen: ":1", Inner: inner{Idle: time.Second, Names: []string{"a"}}, Skipped: 1}
	next := outer{Listen: ":2", Inner: inner{Idle: 2 * time.Second, Names: []string{"b"}}, Skipped: 2}
	Keep("server", reflect.ValueOf(&next).Elem(), reflect.ValueOf(running), func(key string) bool { return key == "server.timeouts.idle" })
	want := outer{Listen: ":1", Inner: inner{Idle: 2 * time.Second, Names: []string{"a"}}, Skipped: 2}
	if !reflect.DeepEqual(next, want) {
		t.Errorf("Keep = %+v, want %+v (only server.timeouts.idle from next; - fields untouched)", next, want)
	}
}
