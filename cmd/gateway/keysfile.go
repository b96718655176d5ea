package main

// This file reads auth.keys_file: API keys kept in a file of their own, so
// keys are handed out and revoked without touching the main config. The
// file's top level is `keys:`, a list with the items of auth.keys; its keys
// are appended to auth.keys (the config's first) and validated with them,
// so names and hashes are unique across both, and a problem with one of
// the file's keys names the file and its index there. The file is read on
// every load (start, SIGHUP, a watched change of either file): the keys of
// both sources are applied together, by the one reload path.
//
// Without limits.redis the gateway's keys API (POST/PATCH/DELETE
// /admin/keys) rewrites this file atomically, in the same format with a
// created_at on the keys it creates, and puts the keys in force in its own
// process at once; the watch then finds the file as the process has it.

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"

	"github.com/switchboard-gw/switchboard/gateway"
)

// AuthConfig is the `auth` section: the gateway's (keys,
// hide_unauthorized_models) and keys_file, which the loader reads into
// Keys.
type AuthConfig struct {
	gateway.AuthConfig `koanf:",squash"`
	// KeysFile is a YAML file of more keys (`keys:`, items as in
	// auth.keys), appended to Keys; "" = none. A relative path is relative
	// to the working directory, as --config is. The file must exist and be
	// valid, at start and on every reload; a reload that finds it changed,
	// or names another file, applies its keys with the config's.
	KeysFile string `koanf:"keys_file"`

	// fromFile is how many of Keys, at the end, were read from KeysFile.
	fromFile int
}

// keysDoc is the content of a keys file.
type keysDoc struct {
	Keys []fileKey `koanf:"keys"`
}

// fileKey is one key of a keys file: auth.keys' items and created_at,
// which the gateway's keys API writes (gateway.KeysFileYAML) for the keys
// it creates.
type fileKey struct {
	gateway.KeyConfig `koanf:",squash"`
	// Created is when the keys API created the key, RFC 3339 (absent for
	// a key written by hand): a string, or the time the YAML parser makes
	// of an unquoted one.
	Created any `koanf:"created_at"`
}

var keysDocType = reflect.TypeFor[keysDoc]()

// loadKeysFile reads the keys file at path. It returns its keys, the
// contentSum of the bytes read (or of the read error) for the watch, and
// every problem with the file at once, each starting "keys_file <path>: ":
// unreadable, not YAML, a key that is not a keys file's (a misspelled
// requests_per_minute must not silently mean no limit), a value of the
// wrong type, or no `keys:` list at all (an empty file is more likely a
// truncated one than a revocation of every key; `keys: []` says so).
func loadKeysFile(path string) ([]gateway.KeyConfig, [32]byte, error) {
	k := koanf.New(".")
	src := &summed{Provider: file.Provider(path)}
	if err := k.Load(src, yaml.Parser()); err != nil {
		return nil, src.sum, fmt.Errorf("keys_file %s: %w", path, err)
	}
	data := k.Raw()
	c := checker{root: keysDocType}
	c.section("", data, keysDocType, false)
	var errs []error
	for _, p := range c.problems {
		msg := p.msg
		if len(p.suggest) > 0 {
			msg += " (did you mean " + orList(p.suggest) + "?)"
		}
		errs = append(errs, fmt.Errorf("keys_file %s: %s: %s", path, p.key, msg))
	}
	if _, ok := data["keys"]; !ok {
		errs = append(errs, fmt.Errorf("keys_file %s: no `keys:` list (write `keys: []` for a file with none)", path))
	}
	if len(errs) > 0 {
		return nil, src.sum, errors.Join(errs...)
	}
	var doc keysDoc
	// The check above has reported unknown keys already; ErrorUnused is a
	// backstop, as in loadConfigSum.
	dc := decoderConfig()
	dc.ErrorUnused = true
	if err := k.UnmarshalWithConf("", &doc, koanf.UnmarshalConf{Tag: "koanf", DecoderConfig: dc}); err != nil {
		return nil, src.sum, fmt.Errorf("keys_file %s: %w", path, err)
	}
	keys := make([]gateway.KeyConfig, len(doc.Keys))
	for i, fk := range doc.Keys {
		keys[i] = fk.KeyConfig
		keys[i].Source = gateway.KeySourceKeysFile
		switch c := fk.Created.(type) {
		case nil:
		case time.Time:
			keys[i].CreatedAt = c.UTC()
		default:
			t, err := time.Parse(time.RFC3339, fmt.Sprint(c))
			if err != nil {
				errs = append(errs, fmt.Errorf("keys_file %s: keys[%d].created_at: %q is not an RFC 3339 time (2006-01-02T15:04:05Z)", path, i, fmt.Sprint(c)))
			}
			keys[i].CreatedAt = t.UTC()
		}
	}
	if len(errs) > 0 {
		return nil, src.sum, errors.Join(errs...)
	}
	return keys, src.sum, nil
}

// Validate reports every bad key of both sources (gateway.AuthConfig's
// checks of the merged list), a problem with one of the file's keys worded
// for the file: "keys_file /etc/sb/keys.yaml: keys[2].name: duplicate key
// name ..." (a duplicate is always reported on the later key, so on the
// file's). Without auth.required it also refuses a keys file that leaves
// no key at all: auth would be off and every request served, which a file
// meant to hold the keys must not do by being emptied (under
// auth.required no key refuses every request: the file may be empty, and
// the keys API fill it).
func (a AuthConfig) Validate() error {
	var errs []error
	if a.KeysFile != "" && len(a.Keys) == 0 && !a.Required {
		errs = append(errs, fmt.Errorf("keys_file %s: no key in it nor in auth.keys: auth would be off (every request served); "+
			"add a key, set auth.required: true (no key then refuses every request), or remove auth.keys_file to run without auth", a.KeysFile))
	}
	err := a.AuthConfig.Validate()
	if a.fromFile > 0 && err != nil {
		err = a.inFile(err)
	}
	return errors.Join(append(errs, err)...)
}

// keyIndex finds the key a gateway.AuthConfig problem is about.
var keyIndex = regexp.MustCompile(`auth\.keys\[(\d+)\]`)

// inFile rewords each problem of err (an errors.Join of them) that is
// about one of the file's keys for the file, keeping its chain.
func (a AuthConfig) inFile(err error) error {
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	first := len(a.Keys) - a.fromFile
	out := make([]error, 0, len(list))
	for _, e := range list {
		msg := e.Error()
		m := keyIndex.FindStringSubmatchIndex(msg)
		if m == nil {
			out = append(out, e)
			continue
		}
		i, _ := strconv.Atoi(msg[m[2]:m[3]])
		if i < first {
			out = append(out, e)
			continue
		}
		// What precedes the key is the gateway's "invalid gateway config"
		// prefix; the file's name takes its place.
		out = append(out, &keysFileError{msg: fmt.Sprintf("keys_file %s: keys[%d]%s", a.KeysFile, i-first, msg[m[1]:]), err: e})
	}
	return errors.Join(out...)
}

// keysFileError is a problem with a key of the keys file, worded for the
// file; it wraps the gateway's error (errors.Is finds
// gateway.ErrInvalidConfig).
type keysFileError struct {
	msg string
	err error
}

func (e *keysFileError) Error() string { return e.msg }
func (e *keysFileError) Unwrap() error { return e.err }
