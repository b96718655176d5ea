package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/quota"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// AuthConfig is the top-level `auth` section (the loader fills it in): the
// API keys clients present. With no key configured and Required false,
// auth is off and every request is served; with a key, or Required,
// every route but /health and /ready needs a key.
type AuthConfig struct {
	// Required, when true, keeps auth on with no key at all: every
	// request needs a key, and none is answered 401. The keys API keeps
	// its keys in Redis (limits.redis) only with it set, so that a Redis
	// that loses them (a restart without persistence, a flush, an
	// eviction) leaves the gateway refusing requests rather than serving
	// everyone. Default false.
	Required bool `koanf:"required"`
	// Keys are the API keys, by the SHA-256 of their value (the gateway
	// never holds a key itself).
	Keys []KeyConfig `koanf:"keys"`
	// HideUnauthorizedModels, when true, answers a request for a model its
	// key may not use as an unknown model (404 model_not_found) instead of
	// 403 permission_denied, so a key cannot learn what else is served.
	HideUnauthorizedModels bool `koanf:"hide_unauthorized_models"`
	// KeysFilePath is auth.keys_file as the loader read it ("" = none; not
	// a key of this section: the loader fills it in). Without
	// limits.redis the keys API writes the keys it manages there
	// (keysapi.go).
	KeysFilePath string `koanf:"-"`
}

// KeyConfig is one API key.
type KeyConfig struct {
	// Name identifies the key on the access log and the server span
	// (switchboard.key): the configured names and those of the keys API,
	// at most MaxAPIKeys of them, so the set is bounded.
	Name string `koanf:"name"`
	// SHA256 is the hex SHA-256 of the key (`switchboard keys hash`).
	SHA256 string `koanf:"sha256"`
	// Models are the path.Match globs of the model names (as the client
	// names them: an alias, not its target) the key may use; "*" does not
	// match a "/", so "*/*" or "meta-llama/*" for ids with one.
	Models []string `koanf:"models"`
	// Limits are the key's limits (none by default), shared by the fleet
	// when LimitsConfig.Redis is set, per process otherwise.
	Limits KeyLimits `koanf:"limits"`
	// Source is where the key was read from: KeySourceConfig ("" counts
	// as it) or KeySourceKeysFile, set by the loader; not a config key.
	Source string `koanf:"-"`
	// CreatedAt is when the keys API created the key (UTC, whole
	// seconds); zero for a key written by hand. Not a config key: the
	// keys file's created_at.
	CreatedAt time.Time `koanf:"-"`
}

// KeyLimits are one key's limits; 0 means no limit of that kind.
type KeyLimits struct {
	// RequestsPerMinute: at most this many requests in any minute (a
	// bucket of this size refilling continuously: GCRA).
	RequestsPerMinute int64 `koanf:"requests_per_minute" json:"requests_per_minute"`
	// TokensPerMinute: input plus output tokens per minute, reserved at
	// admission (prompt estimate + max_tokens) and settled to the usage
	// when the request ends.
	TokensPerMinute int64 `koanf:"tokens_per_minute" json:"tokens_per_minute"`
	// Concurrent: requests in flight at once.
	Concurrent int64 `koanf:"concurrent" json:"concurrent"`
	// MaxSpendPerDay and MaxSpendPerMonth: the most the key's requests
	// may cost in one UTC calendar day and month, in USD, at the
	// configured prices (the pricing list; an unpriced request costs
	// nothing). A request reserves its worst-case cost at admission (its
	// prompt estimate and max_tokens at the highest price its model has)
	// and is settled to its real cost when it ends, in the same store as
	// the token limits (memory, or Redis across replicas). An exhausted
	// budget is answered 429 insufficient_quota, OpenAI's. 0 = no limit.
	MaxSpendPerDay   float64 `koanf:"max_spend_per_day" json:"max_spend_per_day"`
	MaxSpendPerMonth float64 `koanf:"max_spend_per_month" json:"max_spend_per_month"`
}

// maxSpendUSD is the largest spend budget, in USD: the Redis store's Lua
// numbers are doubles, exact in 10^-9 USD up to 2^53 (about $9 million).
const maxSpendUSD = 9e6

// nanoUSD converts USD to the quota store's unit, 10^-9 USD, rounded;
// negative and NaN are 0, +Inf saturates.
func nanoUSD(usd float64) int64 {
	switch {
	case !(usd > 0):
		return 0
	case usd >= math.MaxInt64/1e9:
		return math.MaxInt64
	}
	return int64(math.Round(usd * 1e9))
}

// MaxKeyNameLen caps a key's name, in bytes.
const MaxKeyNameLen = 64

// Validate reports every bad key: a name empty, longer than
// MaxKeyNameLen, with a control character or used twice; a sha256 not 64
// hex digits or the same as another key's; no model glob, or one
// path.Match refuses. Errors wrap [ErrInvalidConfig], joined with
// errors.Join.
func (c AuthConfig) Validate() error {
	var errs []error
	for _, p := range c.problems() {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidConfig, p))
	}
	return errors.Join(errs...)
}

func (c AuthConfig) problems() []string {
	var bad []string
	names, hashes := map[string]bool{}, map[string]bool{}
	for i, k := range c.Keys {
		at := "auth.keys[" + strconv.Itoa(i) + "]"
		switch {
		case k.Name == "":
			bad = append(bad, at+".name must not be empty")
		case len(k.Name) > MaxKeyNameLen:
			bad = append(bad, fmt.Sprintf("%s.name is longer than %d bytes", at, MaxKeyNameLen))
		case hasControl(k.Name):
			bad = append(bad, at+".name has a control character")
		case names[k.Name]:
			bad = append(bad, fmt.Sprintf("%s.name: duplicate key name %q", at, k.Name))
		}
		names[k.Name] = true
		if h, err := hex.DecodeString(k.SHA256); err != nil || len(h) != sha256.Size {
			bad = append(bad, at+".sha256 must be 64 hex digits (switchboard keys hash prints it)")
		} else if lh := strings.ToLower(k.SHA256); hashes[lh] {
			bad = append(bad, fmt.Sprintf("%s.sha256: the same key as another (%q)", at, k.Name))
		} else {
			hashes[lh] = true
		}
		if k.Limits.RequestsPerMinute < 0 || k.Limits.TokensPerMinute < 0 || k.Limits.Concurrent < 0 {
			bad = append(bad, at+".limits must not be negative (0 = no limit)")
		}
		if sd, sm := k.Limits.MaxSpendPerDay, k.Limits.MaxSpendPerMonth; !(sd >= 0 && sd <= maxSpendUSD) || !(sm >= 0 && sm <= maxSpendUSD) ||
			sd > 0 && sd < 1e-6 || sm > 0 && sm < 1e-6 {
			bad = append(bad, at+".limits.max_spend_per_day and max_spend_per_month must be 0 (no limit) or $0.000001 to $9,000,000 (the store keeps 10^-9 USD exactly up to 2^53)")
		}
		if len(k.Models) == 0 {
			bad = append(bad, at+".models must name at least one model glob (\"*\" for every model)")
		}
		for j, g := range k.Models {
			if _, err := path.Match(g, ""); err != nil || g == "" || hasControl(g) {
				bad = append(bad, fmt.Sprintf("%s.models[%d]: %q is not a path.Match glob", at, j, g))
			}
		}
	}
	return bad
}

// apiKey is a configured key as the request path checks it.
type apiKey struct {
	name   string
	hash   [sha256.Size]byte
	models []string
	limits quota.Limits
	attrs  *telemetry.KeyAttrs
}

// compileKeys returns the keys of a validated c.
func compileKeys(c AuthConfig) []apiKey {
	keys := make([]apiKey, len(c.Keys))
	for i, k := range c.Keys {
		keys[i] = apiKey{name: k.Name, models: k.Models, attrs: telemetry.NewKeyAttrs(k.Name),
			limits: quota.Limits{RequestsPerMinute: k.Limits.RequestsPerMinute, TokensPerMinute: k.Limits.TokensPerMinute, Concurrent: k.Limits.Concurrent,
				SpendPerDay: nanoUSD(k.Limits.MaxSpendPerDay), SpendPerMonth: nanoUSD(k.Limits.MaxSpendPerMonth)}}
		_, _ = hex.Decode(keys[i].hash[:], []byte(k.SHA256))
	}
	return keys
}

// allows reports whether k may use model, as the client named it.
func (k *apiKey) allows(model string) bool {
	for _, g := range k.models {
		if ok, _ := path.Match(g, model); ok {
			return true
		}
	}
	return false
}

// matchKey returns the index of the key whose hash is sum, or -1. Every
// configured hash is compared, in constant time and with no early exit, so
// the time taken says neither whether nor which key matched.
func matchKey(keys []apiKey, sum [sha256.Size]byte) int {
	found := -1
	for i := range keys {
		eq := subtle.ConstantTimeCompare(keys[i].hash[:], sum[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	return found
}

// errMalformedAuth is the presented credential when Authorization is not
// "Bearer <key>".
var errMalformedAuth = errors.New("malformed authorization")

// presentedKey returns the key the client sent: Authorization: Bearer <key>
// (the OpenAI SDKs), else x-api-key (the Anthropic SDK); "" when neither is
// there.
func presentedKey(r *http.Request) (string, error) {
	if v := r.Header.Get("Authorization"); v != "" {
		scheme, key, ok := strings.Cut(v, " ")
		key = strings.TrimSpace(key)
		if !ok || !strings.EqualFold(scheme, "Bearer") || key == "" {
			return "", errMalformedAuth
		}
		return key, nil
	}
	return r.Header.Get("X-Api-Key"), nil
}

func errUnauthorized(msg string) *APIError {
	return &APIError{Status: http.StatusUnauthorized, Type: TypeInvalidRequest, Code: "invalid_api_key", Message: msg}
}

// errPermissionDenied is the 403 for a model the request's key may not use.
func errPermissionDenied(model string) *APIError {
	return &APIError{Status: http.StatusForbidden, Type: TypeInvalidRequest, Param: "model", Code: "permission_denied",
		Message: "this api key may not use the model `" + model + "`"}
}

// authenticate checks the request's API key when auth is on (Config.Auth):
// missing, malformed or unknown, the request is answered 401 in its
// route's envelope before its body is read. The key found is kept in the
// request state (authorize and the model list read it) and its name goes
// on the access log and the server span; the key itself goes nowhere (the
// headers carrying it are never forwarded, see notToEngine).
func (s *Server) authenticate(next http.Handler) http.Handler {
	return door(func(w http.ResponseWriter, r *http.Request) error {
		set := s.set.Load()
		if len(set.keys) == 0 && !set.cfg.Auth.Required {
			next.ServeHTTP(w, r)
			return nil
		}
		// The keys API's keys in Redis count under auth.required only;
		// unread, or not checked for longer than keysMaxStale (a revoked
		// key may be among them), they are not trusted.
		api, apiOK := noAPIKeys, true
		if set.cfg.Auth.Required {
			api, apiOK = s.keys.current(), s.keys.trusted(time.Now())
		}
		if len(set.keys) == 0 && !apiOK {
			// Every key is in Redis, which cannot be trusted now:
			// refusing is safe, serving everyone is not.
			closeAfterUnreadBody(w, http.NewResponseController(w))
			return errKeysUnavailable()
		}
		st := stateFrom(r.Context())
		key, err := presentedKey(r)
		var ae *APIError
		switch {
		case err != nil:
			ae = errUnauthorized("the authorization header must be `Bearer <api key>`")
		case key == "":
			ae = errUnauthorized("no api key: send it as `Authorization: Bearer <key>` or `x-api-key`")
			ae.Code = "missing_api_key"
		default:
			sum := sha256.Sum256([]byte(key))
			var k *apiKey
			if i := matchKey(set.keys, sum); i >= 0 {
				k = &set.keys[i]
			} else if apiOK {
				k = api.match(set, sum)
			}
			if k != nil {
				if st != nil {
					st.key = k
				}
				if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
					span.SetAttributes(telemetry.AttrKey.String(k.name))
				}
				next.ServeHTTP(w, r)
				return nil
			}
			if !apiOK {
				// Perhaps a key of the keys API not read, or not checked,
				// lately: a 503 the client retries, not a 401 it believes.
				closeAfterUnreadBody(w, http.NewResponseController(w))
				return errKeysUnavailable()
			}
			ae = errUnauthorized("incorrect api key provided")
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="switchboard"`)
		closeAfterUnreadBody(w, http.NewResponseController(w))
		return ae
	})
}

// authorize decides whether the request's key may use model (as the
// client named it), once the body has been read and before any engine is
// picked: nil, 403 permission_denied, or with
// AuthConfig.HideUnauthorizedModels the 404 an unknown model gets. A
// request naming no model is allowed on a route that names none; elsewhere
// it needs a key that may use every model.
func (s *Server) authorize(st *reqState, set *settings, op *operation, model string) error {
	if st == nil || st.key == nil || model == "" && op.model == modelNone {
		return nil
	}
	if st.key.allows(model) {
		return nil
	}
	if set.cfg.Auth.HideUnauthorizedModels {
		return errModelNotFound(model)
	}
	return errPermissionDenied(model)
}

// keyOf returns the request's API key, nil when auth is off.
func keyOf(r *http.Request) *apiKey {
	if st := stateFrom(r.Context()); st != nil {
		return st.key
	}
	return nil
}

// modelsFor returns the GET /v1/models body of the models in cards key may
// use.
func modelsFor(key *apiKey, cards map[string]fleet.ModelCard) []byte {
	list := struct {
		Object string            `json:"object"`
		Data   []fleet.ModelCard `json:"data"`
	}{Object: "list", Data: []fleet.ModelCard{}}
	for id, c := range cards {
		if key.allows(id) {
			list.Data = append(list.Data, c)
		}
	}
	sort.Slice(list.Data, func(i, j int) bool { return list.Data[i].ID < list.Data[j].ID })
	b, _ := json.Marshal(list)
	return b
}
