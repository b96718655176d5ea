package gateway

// The keys API: API keys created, changed and revoked at run time on the
// admin listener, beside the keys of the config file (auth.keys) and of
// the keys file (auth.keys_file).
//
// Where the keys it manages live:
//
//   - With limits.redis set and auth.required, in Redis: a hash of name ->
//     JSON record (keyRecord) at <limits.redis.key_prefix>{keys} and a
//     version counter at <limits.redis.key_prefix>{keys}:version,
//     incremented by every change. Every replica polls the counter
//     (keysPollInterval) and reads the hash again when it moves, and all
//     of it every keysFullReload whatever the counter says, so a revoked
//     key is refused on every replica within a poll. A replica that has
//     not heard from Redis for keysMaxStale answers the keys API's keys
//     503 keys_unavailable (a revocation may be among what it missed);
//     the keys of the configuration keep working. auth.required is what
//     makes a Redis that lost its keys (a restart without persistence, a
//     flush) refuse every request instead of turning auth off.
//   - Otherwise, in auth.keys_file, rewritten atomically (a temporary
//     file in its directory, fsync, rename): the keys file's keys are the
//     ones the API edits, and its file watch reloads any other process
//     reading the file. A file changed by hand since it was read is not
//     overwritten (409 keys_file_changed).
//   - With neither, the write routes answer 409 keys_api_unavailable.
//
// Keys of every source share one name space. Keys of the main config file
// are never changed here (409 key_managed_in_config).

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/switchboard-gw/switchboard/internal/loglimit"
)

// The sources of a key, as KeyStatus.Source and KeyConfig.Source name
// them.
const (
	// KeySourceConfig is a key of the main config file (auth.keys): it is
	// changed there, never through the keys API.
	KeySourceConfig = "config"
	// KeySourceKeysFile is a key of auth.keys_file. Without limits.redis
	// the keys API edits that file, so its keys are the API's to change.
	KeySourceKeysFile = "keys_file"
	// KeySourceAPI is a key the keys API keeps in Redis.
	KeySourceAPI = "api"
)

// KeyPrefix starts every key the keys API creates: "sk-sb-" and the
// base64url (unpadded) of 32 random bytes.
const KeyPrefix = "sk-sb-"

// MaxAPIKeys is the most keys the keys API keeps in Redis (each is held
// in every replica's memory and named on its metrics).
const MaxAPIKeys = 10000

// keysPollInterval is how often each replica reads the Redis version
// counter of the keys.
const keysPollInterval = 250 * time.Millisecond

// keysFullReload is how often each replica reads every key from Redis
// whatever the version counter says: a Redis that lost writes (a
// failover to a replica behind, a restored backup) may show a counter
// equal to the one read last with other keys.
const keysFullReload = 30 * time.Second

// keysMaxStale is how long a replica trusts the keys it read from Redis
// without a successful check: past it the keys API's keys are answered
// 503 keys_unavailable until Redis answers, so a key revoked meanwhile is
// never served for longer. Four polls: a check that fails or times out
// (keysCheckTimeout) leaves the next ones time to answer.
const keysMaxStale = 4 * keysPollInterval

// keysCheckTimeout bounds one check of the version counter (375 ms), and
// keysPollReadTimeout one read of every key by the poll (500 ms): both
// well under keysMaxStale, so a slow answer, which holds up the poll,
// does not make the keys untrusted before the next check can answer.
// Reads outside the poll (at start, after a write) wait up to
// limits.redis.timeout (at least keysMinTimeout).
const (
	keysCheckTimeout    = keysMaxStale/2 - keysPollInterval/2
	keysPollReadTimeout = keysMaxStale - 2*keysPollInterval
)

// keysMinTimeout is the shortest wait for a Redis call of the keys API:
// limits.redis.timeout is sized for an admission (50 ms by default), a
// read of every key may take longer.
const keysMinTimeout = time.Second

// WithKeysFileReader sets how the keys API reads auth.keys_file before it
// rewrites it (cmd/gateway passes its loader, so an edit by hand that has
// not been reloaded yet is kept, and a broken file is not overwritten).
// Default: the keys file's keys the running settings hold. A nil argument
// is ignored.
func WithKeysFileReader(read func(path string) ([]KeyConfig, error)) Option {
	return optionFunc(func(c *config) {
		if read != nil {
			c.keysFile = read
		}
	})
}

// keysAPI is the server's side of the keys API.
type keysAPI struct {
	// mu serializes the keys file's writes of this process, so two
	// creates never rewrite it from the same old content, and a reload
	// (LockKeysFile) never applies keys read before a write.
	mu       sync.Mutex
	readFile func(path string) ([]KeyConfig, error) // nil: the settings' keys
	rds      *redisKeys                             // nil without limits.redis
	log      *slog.Logger
}

// apiEntry is one key read from Redis.
type apiEntry struct {
	key apiKey
	cfg KeyConfig // as created, for GET /admin/keys
}

// apiKeySet is the keys read from Redis, immutable once built.
type apiKeySet struct {
	// loaded: read at least once (or no Redis at all). Until then whether
	// auth is on is not known.
	loaded  bool
	version int64
	entries []apiEntry // sorted by name
	byHash  map[[sha256.Size]byte]*apiKey
	records map[string]string // name -> its JSON, as Redis holds it
}

// noAPIKeys is the set of a server without Redis.
var noAPIKeys = &apiKeySet{loaded: true}

// current returns the keys read from Redis (none without Redis).
func (k *keysAPI) current() *apiKeySet {
	if k == nil || k.rds == nil {
		return noAPIKeys
	}
	return k.rds.set.Load()
}

// trusted reports whether the keys read from Redis may be used at now:
// read at least once, and checked against Redis within keysMaxStale.
// Always true without Redis.
func (k *keysAPI) trusted(now time.Time) bool {
	if k == nil || k.rds == nil {
		return true
	}
	return k.rds.set.Load().loaded && now.UnixNano()-k.rds.synced.Load() <= int64(keysMaxStale)
}

// lockFor takes the keys file's lock when the keys API writes to the keys
// file (a read, a rewrite and an apply that must not interleave with
// another or with a reload), checks that the key named edit ("" for a new
// one) is the API's to change (Server.editable), and returns the settings
// as they are under the lock and the release (a no-op for Redis, whose scripts are atomic: no
// reload waits behind a slow Redis; a write racing a reload that turns
// auth.required off may then answer for a key that is not in force, which
// fails closed).
func (s *Server) lockFor(edit string) (*settings, string, func(), error) {
	set := s.set.Load()
	path, err := s.keyStore(set)
	if err != nil {
		return set, path, func() {}, err
	}
	unlock := func() {}
	if path != "" {
		s.keys.mu.Lock()
		set = s.set.Load() // what a reload applied while this waited
		if path, err = s.keyStore(set); err != nil || path == "" {
			s.keys.mu.Unlock()
			return set, path, func() {}, err
		}
		unlock = s.keys.mu.Unlock
	}
	if edit != "" {
		if err := s.editable(set, edit); err != nil {
			unlock()
			return set, path, func() {}, err
		}
	}
	return set, path, unlock, nil
}

// LockKeysFile takes the lock the keys API holds while it reads,
// rewrites and applies auth.keys_file, and returns its release. A
// reloader that reads the keys file and then applies what it read
// (Server.Reload) holds it across both, so a revocation written
// meanwhile is never undone by keys read before it.
func (s *Server) LockKeysFile() (unlock func()) {
	s.keys.mu.Lock()
	return s.keys.mu.Unlock
}

// match returns the key whose hash is sum, nil when none (or when a key of
// the configuration has its name: the configuration wins). A map lookup,
// not matchKey's constant-time scan: the keys API's keys are 32 random
// bytes, so what the lookup's timing could tell about a presented key's
// SHA-256 helps no one find a key.
func (a *apiKeySet) match(set *settings, sum [sha256.Size]byte) *apiKey {
	k := a.byHash[sum]
	if k == nil || configHas(set.keys, k.name) {
		return nil
	}
	return k
}

// configHas reports whether one of keys is named name.
func configHas(keys []apiKey, name string) bool {
	for i := range keys {
		if keys[i].name == name {
			return true
		}
	}
	return false
}

// keyRecord is one API key as Redis keeps it, JSON under its name.
type keyRecord struct {
	Name      string    `json:"name"`
	SHA256    string    `json:"sha256"`
	Models    []string  `json:"models"`
	Limits    KeyLimits `json:"limits"`
	CreatedAt time.Time `json:"created_at"`
}

// redisKeys is the keys API's Redis: its client, its keys and the poll.
type redisKeys struct {
	client        *redis.Client
	hash, version string
	timeout       time.Duration
	set           atomic.Pointer[apiKeySet]
	// synced is when (Unix ns) Redis last answered a check or a read.
	synced atomic.Int64
	// reloadMu makes reads of the hash one at a time, so an older read
	// never replaces a newer one.
	reloadMu sync.Mutex
	log      *slog.Logger
	errLog   loglimit.Limiter // Redis failures of the poll
	badLog   loglimit.Limiter // records that are not valid keys
	idleLog  loglimit.Limiter // keys in Redis while auth.required is off
	// required reports whether auth.required is on: the keys in Redis
	// are in use, and the poll's failures worth a warning.
	required func() bool
	cancel   context.CancelFunc
	done     chan struct{}
	// unhold releases /ready, held until the first read.
	unhold     func()
	unholdOnce sync.Once
}

// newKeysAPI builds the keys API of s. With limits.redis set it reads the
// keys from Redis once and starts the poll. Under auth.required, until a
// read succeeds a key not in the configuration gets 503 keys_unavailable,
// and with no key configured every request does and /ready is held.
func newKeysAPI(s *Server, cfg Config, readFile func(string) ([]KeyConfig, error), log *slog.Logger) (*keysAPI, error) {
	k := &keysAPI{readFile: readFile, log: log}
	rc := cfg.Limits.Redis
	if rc.Address == "" {
		return k, nil
	}
	var password string
	if rc.PasswordEnv != "" {
		if password = os.Getenv(rc.PasswordEnv); password == "" {
			return nil, fmt.Errorf("%w: limits.redis.password_env: %s is not set or empty", ErrInvalidConfig, rc.PasswordEnv)
		}
	}
	timeout := max(rc.Timeout, keysMinTimeout)
	ro := &redis.Options{
		Addr: rc.Address, Username: rc.Username, Password: password, DB: rc.DB,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, PoolSize: 2,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if rc.TLS {
		// As the limits' store connects (quota.NewRedis).
		host, _, _ := net.SplitHostPort(rc.Address)
		ro.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	r := &redisKeys{
		client: redis.NewClient(ro), hash: rc.KeyPrefix + "{keys}", version: rc.KeyPrefix + "{keys}:version",
		timeout: timeout, log: log,
		errLog: loglimit.Limiter{Interval: time.Minute}, badLog: loglimit.Limiter{Interval: time.Minute}, idleLog: loglimit.Limiter{Interval: time.Hour},
		done: make(chan struct{}),
		required: func() bool {
			set := s.set.Load()
			return set != nil && set.cfg.Auth.Required
		},
	}
	r.set.Store(&apiKeySet{})
	k.rds = r
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	if !cfg.Auth.Required {
		// The keys in Redis are not in force: the poll reads them, no
		// one waits for it.
	} else if err := r.reload(ctx); err != nil {
		// Until the keys are read, a key not in the configuration gets
		// 503. With no key configured every request does, and /ready
		// waits. (Without auth.required the keys in Redis are not used.)
		log.Warn("cannot read the api keys from redis: a key not in the configuration gets 503 until it answers", "error", err)
		if len(cfg.Auth.Keys) == 0 {
			r.unhold = s.HoldReady("the api keys in redis")
		}
	}
	go r.poll(ctx)
	return k, nil
}

// close stops the poll and closes the client.
func (k *keysAPI) close() error {
	if k == nil || k.rds == nil {
		return nil
	}
	k.rds.cancel()
	<-k.rds.done
	return k.rds.client.Close()
}

// poll reads the version counter every keysPollInterval and the keys when
// it moved, until ctx ends.
func (r *redisKeys) poll(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(keysPollInterval)
	defer t.Stop()
	full := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if time.Since(full) >= keysFullReload {
			full = time.Now()
			err = r.reloadWithin(ctx, min(r.timeout, keysPollReadTimeout))
		} else {
			err = r.check(ctx)
		}
		if err != nil && ctx.Err() == nil && r.required() {
			if suppressed, ok := r.errLog.Allow(time.Now()); ok {
				r.log.Warn("cannot check the api keys in redis: keys of the keys api get 503 keys_unavailable until it answers (the configured keys still work)", "error", err, "suppressed", suppressed)
			}
		}
	}
}

// check reads the keys again when the version counter moved.
func (r *redisKeys) check(ctx context.Context) error {
	cur := r.set.Load()
	if cur.loaded {
		// Stamped with the time it was sent: an answer proves the keys
		// current as of then, not of when it arrived. Bounded well under
		// keysMaxStale, so one slow answer leaves time for the next.
		sent := time.Now()
		cctx, cancel := context.WithTimeout(ctx, min(r.timeout, keysCheckTimeout))
		v, err := r.client.Get(cctx, r.version).Int64()
		cancel()
		if errors.Is(err, redis.Nil) {
			v, err = 0, nil
		}
		if err != nil {
			return err
		}
		if v == cur.version {
			r.synced.Store(sent.UnixNano())
			return nil
		}
		if v < cur.version && r.required() {
			// The counter only grows: Redis lost its keys (a restart
			// without persistence, a flush, an eviction, a failover to
			// a replica behind). What it holds now is in force, none
			// at all meaning every request is refused (auth.required).
			r.log.Error("the api keys in redis were lost or rolled back: the keys redis holds now are in force; configure redis with persistence and maxmemory-policy noeviction",
				"version_was", cur.version, "version_now", v, "keys_were", len(cur.entries))
		}
	}
	return r.reloadWithin(ctx, min(r.timeout, keysPollReadTimeout))
}

// reload reads the version and every key in one transaction and puts
// them in force, waiting for Redis up to its timeout.
func (r *redisKeys) reload(ctx context.Context) error { return r.reloadWithin(ctx, r.timeout) }

// reloadWithin is reload waiting for Redis up to d.
func (r *redisKeys) reloadWithin(ctx context.Context, d time.Duration) error {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	pipe := r.client.TxPipeline()
	ver := pipe.Get(ctx, r.version)
	all := pipe.HGetAll(ctx, r.hash)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	v, err := ver.Int64()
	if errors.Is(err, redis.Nil) {
		v, err = 0, nil
	}
	if err != nil {
		return err
	}
	r.set.Store(r.compile(all.Val(), v))
	r.synced.Store(sent.UnixNano())
	if n := len(all.Val()); n > 0 && !r.required() {
		if suppressed, ok := r.idleLog.Allow(time.Now()); ok {
			r.log.Warn("api keys in redis are not in force: auth.required is off, so only the configured keys are checked (set auth.required: true on every replica)",
				"keys", n, "suppressed", suppressed)
		}
	}
	r.unholdOnce.Do(func() {
		if r.unhold != nil {
			r.unhold()
		}
	})
	return nil
}

// compile builds the set of records (name -> JSON). A record that is not a
// valid key is left out and logged (at most once a minute): only a hand
// edit of Redis makes one.
func (r *redisKeys) compile(records map[string]string, version int64) *apiKeySet {
	set := &apiKeySet{loaded: true, version: version, byHash: make(map[[sha256.Size]byte]*apiKey, len(records)), records: records}
	names := make([]string, 0, len(records))
	for name := range records {
		names = append(names, name)
	}
	sort.Strings(names)
	set.entries = make([]apiEntry, 0, len(names))
	for _, name := range names {
		var rec keyRecord
		err := json.Unmarshal([]byte(records[name]), &rec)
		kc := KeyConfig{Name: rec.Name, SHA256: rec.SHA256, Models: rec.Models, Limits: rec.Limits, Source: KeySourceAPI, CreatedAt: rec.CreatedAt}
		if err == nil && rec.Name != name {
			err = fmt.Errorf("its name is %q", rec.Name)
		}
		if err == nil {
			err = AuthConfig{Keys: []KeyConfig{kc}}.Validate()
		}
		if err != nil {
			if suppressed, ok := r.badLog.Allow(time.Now()); ok {
				r.log.Warn("an api key in redis is not valid: left out", "name", name, "error", err, "suppressed", suppressed)
			}
			continue
		}
		ks := compileKeys(AuthConfig{Keys: []KeyConfig{kc}})
		set.entries = append(set.entries, apiEntry{key: ks[0], cfg: kc})
	}
	for i := range set.entries {
		set.byHash[set.entries[i].key.hash] = &set.entries[i].key
	}
	return set
}

// The scripts of the writes: each changes the hash and increments the
// version in one step. KEYS: the hash, the version counter.
var (
	// ARGV: name, record, MaxAPIKeys. -1: the name exists; -2: full.
	createKeyScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return -1 end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -2 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('INCR', KEYS[2])`)
	// ARGV: name, the record read, the new record. -1: gone; -3: changed
	// since it was read.
	updateKeyScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -1 end
if cur ~= ARGV[2] then return -3 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return redis.call('INCR', KEYS[2])`)
	// ARGV: name, the keys the configuration has. -1: gone; -2: the last
	// key of all.
	deleteKeyScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -1 end
if ARGV[2] == '0' and redis.call('HLEN', KEYS[1]) == 1 then return -2 end
redis.call('HDEL', KEYS[1], ARGV[1])
return redis.call('INCR', KEYS[2])`)
)

// run runs a write script, bounded by the timeout.
func (r *redisKeys) run(ctx context.Context, sc *redis.Script, args ...any) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	return sc.Run(ctx, r.client, []string{r.hash, r.version}, args...).Int64()
}

// applied puts a write in force in this process before its answer: the
// keys are read again; when that fails, the change is applied to the keys
// in force (the poll reads them all when Redis answers again).
func (r *redisKeys) applied(ctx context.Context, name, record string) {
	if err := r.reload(context.WithoutCancel(ctx)); err == nil {
		return
	}
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	cur := r.set.Load()
	if !cur.loaded {
		return // never read: one change is not the whole set; the poll reads it
	}
	recs := make(map[string]string, len(cur.records)+1)
	for n, v := range cur.records {
		recs[n] = v
	}
	if record == "" {
		delete(recs, name)
	} else {
		recs[name] = record
	}
	r.set.Store(r.compile(recs, cur.version))
}

// Errors of the keys API.
func errKeysUnavailable() *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "keys_unavailable",
		Message: "the gateway cannot check its api keys in redis right now (not read since start, or no answer for a second); retry shortly"}
}

func errKeyNotFound(name string) *APIError {
	return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "key_not_found", Message: "no api key named " + strconv.Quote(name)}
}

func errKeyExists(name string) *APIError {
	return &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Param: "name", Code: "key_exists",
		Message: "an api key named " + strconv.Quote(name) + " exists already (names are unique across auth.keys, auth.keys_file and the keys api)"}
}

func errKeyInConfig(name, where string) *APIError {
	return &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "key_managed_in_config",
		Message: "the api key " + strconv.Quote(name) + " is in " + where + ": change it there"}
}

func errKeysStore(err error) *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "keys_store_unavailable",
		Message: "redis did not take the change: nothing changed; retry shortly", Err: err}
}

func errKeysFile(msg string, err error) *APIError {
	return &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "keys_file_write_failed", Message: msg, Err: err}
}

// keyStore is where the keys API writes: Redis, the keys file, or
// nowhere (409 keys_api_unavailable).
func (s *Server) keyStore(set *settings) (file string, err error) {
	if s.redisKeysOn(set) {
		return "", nil
	}
	if p := set.cfg.Auth.KeysFilePath; p != "" {
		return p, nil
	}
	msg := "the keys api needs somewhere to keep its keys: set limits.redis.address and auth.required (shared by every replica) or auth.keys_file (this file, rewritten)"
	if s.keys.rds != nil {
		msg = "the keys api keeps its keys in redis only with auth.required: true (so that a redis that loses them refuses every request instead of turning auth off); set it, or auth.keys_file"
	}
	return "", &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "keys_api_unavailable", Message: msg}
}

// redisKeysOn reports whether the keys API keeps its keys in Redis:
// limits.redis is set and auth.required is on.
func (s *Server) redisKeysOn(set *settings) bool {
	return s.keys.rds != nil && set.cfg.Auth.Required
}

// mountKeysAPI adds the keys API to the admin router:
//
//	POST   /admin/keys         {"name","models","limits"} -> 201 the key, its secret shown this once
//	GET    /admin/keys/{name}  the key's entry (KeyStatus)
//	PATCH  /admin/keys/{name}  {"models"} and/or {"limits"} (replacing all limits) -> 200 its entry
//	DELETE /admin/keys/{name}  revoke -> 200 {"name","revoked":true}
//
// GET /admin/keys (AdminHandler) lists them all. A name in the path is
// path-escaped (url.PathEscape). Errors are the OpenAI error envelope:
// 400 for a bad body, 404 key_not_found, 409 key_exists,
// key_managed_in_config (a key of the main config file), last_key,
// too_many_keys, keys_api_unavailable (no Redis, no keys file), 503
// keys_store_unavailable (Redis did not answer), 500
// keys_file_write_failed.
func (s *Server) mountKeysAPI(r chi.Router) {
	r.Post("/admin/keys", door(s.createKey))
	r.Get("/admin/keys/*", door(s.getKey))
	r.Patch("/admin/keys/*", door(s.updateKey))
	r.Delete("/admin/keys/*", door(s.revokeKey))
}

// keyParam is the key name of a /admin/keys/{name} path, unescaped.
func keyParam(r *http.Request) (string, error) {
	name, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/admin/keys/"))
	if err != nil || name == "" {
		return "", errBadRequest("", "the path must be /admin/keys/{name}, the name path-escaped")
	}
	return name, nil
}

// createdKey is the answer to POST /admin/keys: the only time the secret
// is shown.
type createdKey struct {
	Name      string    `json:"name"`
	Key       string    `json:"key"`
	Models    []string  `json:"models"`
	Limits    KeyLimits `json:"limits"`
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name   string    `json:"name"`
		Models []string  `json:"models"`
		Limits KeyLimits `json:"limits"`
	}
	if err := decodeAdminBody(w, r, &body); err != nil {
		return err
	}
	var raw [32]byte
	_, _ = rand.Read(raw[:])
	secret := KeyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	sum := sha256.Sum256([]byte(secret))
	kc := KeyConfig{Name: body.Name, SHA256: hex.EncodeToString(sum[:]), Models: body.Models, Limits: body.Limits,
		CreatedAt: time.Now().UTC().Truncate(time.Second)}
	if err := checkKey(kc); err != nil {
		return err
	}
	set, path, unlock, err := s.lockFor("")
	defer unlock()
	if err != nil {
		return err
	}
	first := len(set.keys) == 0 && !set.cfg.Auth.Required
	if configHas(set.keys, kc.Name) {
		return errKeyExists(kc.Name)
	}
	if path == "" {
		kc.Source = KeySourceAPI
		rec, _ := json.Marshal(keyRecord{Name: kc.Name, SHA256: kc.SHA256, Models: kc.Models, Limits: kc.Limits, CreatedAt: kc.CreatedAt})
		v, err := s.keys.rds.run(r.Context(), createKeyScript, kc.Name, string(rec), MaxAPIKeys)
		switch {
		case err != nil:
			return errKeysStore(err)
		case v == -1:
			return errKeyExists(kc.Name)
		case v == -2:
			return &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "too_many_keys",
				Message: fmt.Sprintf("the keys api keeps at most %d keys; revoke one first", MaxAPIKeys)}
		}
		s.keys.rds.applied(r.Context(), kc.Name, string(rec))
	} else {
		kc.Source = KeySourceKeysFile
		keys, ver, err := s.fileKeys(set, path)
		if err != nil {
			return err
		}
		if indexKey(keys, kc.Name) >= 0 {
			return errKeyExists(kc.Name)
		}
		if err := s.writeFileKeys(set, path, append(keys, kc), ver); err != nil {
			return err
		}
	}
	s.log.Info("api key created", "name", kc.Name, "source", kc.Source)
	if first {
		s.log.Warn("the first api key: auth is now on, every request needs a key", "name", kc.Name)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(createdKey{Name: kc.Name, Key: secret, Models: kc.Models, Limits: kc.Limits, Source: kc.Source, CreatedAt: kc.CreatedAt})
	return nil
}

func (s *Server) getKey(w http.ResponseWriter, r *http.Request) error {
	name, err := keyParam(r)
	if err != nil {
		return err
	}
	return s.writeKeyStatus(w, name)
}

// writeKeyStatus answers with the key's entry as GET /admin/keys lists
// it.
func (s *Server) writeKeyStatus(w http.ResponseWriter, name string) error {
	for _, k := range s.Keys() {
		if k.Name == name {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(k)
			return nil
		}
	}
	return errKeyNotFound(name)
}

// keyChange is the body of PATCH /admin/keys/{name}: what is absent stays.
type keyChange struct {
	Models *[]string  `json:"models"`
	Limits *KeyLimits `json:"limits"`
}

func (c keyChange) apply(k KeyConfig) KeyConfig {
	if c.Models != nil {
		k.Models = *c.Models
	}
	if c.Limits != nil {
		k.Limits = *c.Limits
	}
	return k
}

// editable returns the error for a name the API may not change here (a
// key of the main config file; with Redis, of the keys file too), nil
// otherwise.
func (s *Server) editable(set *settings, name string) error {
	for _, k := range set.cfg.Auth.Keys {
		if k.Name != name {
			continue
		}
		if k.Source == KeySourceKeysFile && !s.redisKeysOn(set) {
			return nil
		}
		if k.Source == KeySourceKeysFile {
			return errKeyInConfig(name, "auth.keys_file (with limits.redis set the keys api changes only the keys it keeps in redis)")
		}
		return errKeyInConfig(name, "the config file (auth.keys)")
	}
	return nil
}

func (s *Server) updateKey(w http.ResponseWriter, r *http.Request) error {
	name, err := keyParam(r)
	if err != nil {
		return err
	}
	var change keyChange
	if err := decodeAdminBody(w, r, &change); err != nil {
		return err
	}
	if change.Models == nil && change.Limits == nil {
		return errBadRequest("", "nothing to change: send models, limits or both")
	}
	set, path, unlock, err := s.lockFor(name)
	defer unlock()
	if err != nil {
		return err
	}
	if path == "" {
		if err := s.updateRedisKey(r.Context(), name, change); err != nil {
			return err
		}
	} else {
		keys, i, ver, err := s.fileKey(set, path, name)
		if err != nil {
			return err
		}
		keys[i] = change.apply(keys[i])
		if err := checkKey(keys[i]); err != nil {
			return err
		}
		if err := s.writeFileKeys(set, path, keys, ver); err != nil {
			return err
		}
	}
	s.log.Info("api key changed", "name", name, "models", change.Models != nil, "limits", change.Limits != nil)
	return s.writeKeyStatus(w, name)
}

// updateRedisKey changes a key kept in Redis: read, changed, written back
// only if no one changed it in between (else read again, a few times).
func (s *Server) updateRedisKey(ctx context.Context, name string, change keyChange) error {
	rds := s.keys.rds
	for range 5 {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rds.timeout)
		old, err := rds.client.HGet(cctx, rds.hash, name).Result()
		cancel()
		if errors.Is(err, redis.Nil) {
			return errKeyNotFound(name)
		}
		if err != nil {
			return errKeysStore(err)
		}
		var rec keyRecord
		if err := json.Unmarshal([]byte(old), &rec); err != nil {
			return &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "key_invalid",
				Message: "the api key's record in redis is not valid (revoke it and create it again): " + err.Error()}
		}
		kc := change.apply(KeyConfig{Name: rec.Name, SHA256: rec.SHA256, Models: rec.Models, Limits: rec.Limits})
		if err := checkKey(kc); err != nil {
			return err
		}
		rec.Models, rec.Limits = kc.Models, kc.Limits
		b, _ := json.Marshal(rec)
		v, err := rds.run(ctx, updateKeyScript, name, old, string(b))
		switch {
		case err != nil:
			return errKeysStore(err)
		case v == -1:
			return errKeyNotFound(name)
		case v == -3:
			continue // changed meanwhile: again, from what it is now
		}
		rds.applied(ctx, name, string(b))
		return nil
	}
	return &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "key_busy",
		Message: "the api key " + strconv.Quote(name) + " is being changed by others; retry"}
}

func errLastKey(name string) *APIError {
	return &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "last_key",
		Message: "the api key " + strconv.Quote(name) + " is the last one: without a key auth is off and every request is served; create another key first, or set auth.required: true (no key then refuses every request)"}
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) error {
	name, err := keyParam(r)
	if err != nil {
		return err
	}
	set, path, unlock, err := s.lockFor(name)
	defer unlock()
	if err != nil {
		return err
	}
	if path == "" {
		// Under auth.required (always so here) no key left means every
		// request is refused: the last key may go.
		v, err := s.keys.rds.run(r.Context(), deleteKeyScript, name, 1)
		switch {
		case err != nil:
			return errKeysStore(err)
		case v == -1:
			return errKeyNotFound(name)
		case v == -2:
			return errLastKey(name)
		}
		s.keys.rds.applied(r.Context(), name, "")
	} else {
		keys, i, ver, err := s.fileKey(set, path, name)
		if err != nil {
			return err
		}
		others := 0
		for _, k := range set.cfg.Auth.Keys {
			if k.Source != KeySourceKeysFile {
				others++
			}
		}
		if others+len(keys) == 1 && !set.cfg.Auth.Required {
			return errLastKey(name)
		}
		if err := s.writeFileKeys(set, path, append(keys[:i:i], keys[i+1:]...), ver); err != nil {
			return err
		}
	}
	s.log.Info("api key revoked", "name", name)
	s.Keys() // drops the revoked key's usage (limiter.prune)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Name    string `json:"name"`
		Revoked bool   `json:"revoked"`
	}{name, true})
	return nil
}

func indexKey(keys []KeyConfig, name string) int {
	for i, k := range keys {
		if k.Name == name {
			return i
		}
	}
	return -1
}

// checkKey validates one key as AuthConfig.Validate does: 400 invalid_key
// with every problem, param the first one's field.
func checkKey(k KeyConfig) error {
	probs := AuthConfig{Keys: []KeyConfig{k}}.problems()
	if len(probs) == 0 {
		return nil
	}
	for i, p := range probs {
		probs[i] = strings.TrimPrefix(p, "auth.keys[0].")
	}
	param, _, _ := strings.Cut(probs[0], " ")
	param, _, _ = strings.Cut(param, ".")
	param, _, _ = strings.Cut(param, "[")
	param = strings.TrimSuffix(param, ":")
	return &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: param, Code: "invalid_key", Message: strings.Join(probs, "; ")}
}

// decodeAdminBody decodes one JSON object of at most maxAdminBody bytes
// into v, refusing unknown fields: 400 with the field named.
func decodeAdminBody(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, maxAdminBody)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON object")
		}
	}
	if err == nil {
		return nil
	}
	var mbe *http.MaxBytesError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &mbe):
		return &APIError{Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Code: "body_too_large",
			Message: fmt.Sprintf("the body is larger than %d bytes", maxAdminBody), Err: err}
	case errors.Is(err, io.EOF):
		return &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: "invalid_json", Message: "the body is empty: send a JSON object", Err: err}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: field, Code: "unknown_field",
			Message: "unknown field " + strconv.Quote(field) + " (a key has name, models and limits: requests_per_minute, tokens_per_minute, concurrent, max_spend_per_day, max_spend_per_month)", Err: err}
	case errors.As(err, &te):
		return &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: te.Field, Code: "invalid_json",
			Message: fmt.Sprintf("%s must be a JSON %s, not %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value), Err: err}
	}
	return &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: "invalid_json", Message: "the body is not a JSON object: " + err.Error(), Err: err}
}

func jsonKind(k string) string {
	switch {
	case strings.HasPrefix(k, "int"):
		return "integer"
	case strings.HasPrefix(k, "float"):
		return "number"
	case k == "slice":
		return "array"
	case k == "struct":
		return "object"
	}
	return k
}

// fileKeys returns the keys of the keys file at path: as the file says
// now when a reader is set (WithKeysFileReader), else as the settings
// hold them.
func (s *Server) fileKeys(set *settings, path string) ([]KeyConfig, fileVersion, error) {
	ver := fileVersionOf(path)
	keys, err := s.fileKeysNow(set, path)
	return keys, ver, err
}

// fileKey is fileKeys with the index of the key named name in them: 404
// key_not_found when it is not there.
func (s *Server) fileKey(set *settings, path, name string) ([]KeyConfig, int, fileVersion, error) {
	keys, ver, err := s.fileKeys(set, path)
	if err != nil {
		return nil, -1, ver, err
	}
	i := indexKey(keys, name)
	if i < 0 {
		return nil, -1, ver, errKeyNotFound(name)
	}
	return keys, i, ver, nil
}

// fileVersion is the SHA-256 of a file's bytes (of its read error when it
// cannot be read): what the keys API read, compared before it rewrites.
type fileVersion [sha256.Size]byte

func fileVersionOf(path string) fileVersion {
	b, err := os.ReadFile(path)
	if err != nil {
		return sha256.Sum256([]byte("error: " + err.Error()))
	}
	return sha256.Sum256(b)
}

func (s *Server) fileKeysNow(set *settings, path string) ([]KeyConfig, error) {
	if s.keys.readFile != nil {
		keys, err := s.keys.readFile(path)
		if err != nil {
			return nil, &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "keys_file_invalid",
				Message: "the keys file cannot be read, so it is not rewritten: fix it first: " + err.Error(), Err: err}
		}
		for i := range keys {
			keys[i].Source = KeySourceKeysFile
		}
		return keys, nil
	}
	var keys []KeyConfig
	for _, k := range set.cfg.Auth.Keys {
		if k.Source == KeySourceKeysFile {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// writeFileKeys rewrites the keys file with keys (atomically: a temporary
// file in its directory, synced, renamed over it, the directory synced)
// and puts them in force in this process at once, with the main config
// file's keys first, as the loader does. read is the file's version the
// keys were read from: a file changed since (by hand) is not overwritten,
// 409 keys_file_changed.
func (s *Server) writeFileKeys(set *settings, path string, keys []KeyConfig, read fileVersion) error {
	all := make([]KeyConfig, 0, len(set.cfg.Auth.Keys)+len(keys))
	for _, k := range set.cfg.Auth.Keys {
		if k.Source != KeySourceKeysFile {
			all = append(all, k)
		}
	}
	all = append(all, keys...)
	if err := (AuthConfig{Keys: all}).Validate(); err != nil {
		return &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "keys_file_invalid",
			Message: "the keys would not be valid, so the keys file is not rewritten: " + err.Error(), Err: err}
	}
	if fileVersionOf(path) != read {
		return &APIError{Status: http.StatusConflict, Type: TypeInvalidRequest, Code: "keys_file_changed",
			Message: "the keys file " + path + " changed while the keys api read it (an edit by hand?): nothing was written; retry"}
	}
	if err := writeFileAtomic(path, KeysFileYAML(keys)); err != nil {
		return errKeysFile("the keys file "+path+" could not be written: "+err.Error(), err)
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	cur := s.set.Load()
	cfg := cur.cfg
	cfg.Auth.Keys = nil
	for _, k := range cur.cfg.Auth.Keys {
		if k.Source != KeySourceKeysFile {
			cfg.Auth.Keys = append(cfg.Auth.Keys, k)
		}
	}
	cfg.Auth.Keys = append(cfg.Auth.Keys, keys...)
	s.set.Store(newSettings(cfg, cur.policy))
	return nil
}

// writeFileAtomic replaces the file at path (its target, when a symlink)
// with data, keeping its mode (0600 for a new file): readers see the old
// content or the new, never a part.
func writeFileAtomic(path string, data []byte) error {
	if p, err := filepath.EvalSymlinks(path); err == nil {
		path = p
	}
	mode := os.FileMode(0o600)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }() // after the rename: no such file
	if err := f.Chmod(mode); err != nil {
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// KeysFileYAML returns the keys file (auth.keys_file) holding keys, as the
// keys API writes it: `keys:`, each with name, sha256, models, the limits
// that are set and created_at when known. Strings are double-quoted (JSON
// escapes, valid YAML).
func KeysFileYAML(keys []KeyConfig) []byte {
	var b bytes.Buffer
	b.WriteString("# API keys (auth.keys_file), rewritten by the gateway's keys API: comments are not kept.\n")
	if len(keys) == 0 {
		b.WriteString("keys: []\n")
		return b.Bytes()
	}
	b.WriteString("keys:\n")
	q := func(s string) string {
		var sb strings.Builder
		enc := json.NewEncoder(&sb)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		return strings.TrimSuffix(sb.String(), "\n")
	}
	for _, k := range keys {
		fmt.Fprintf(&b, "  - name: %s\n    sha256: %s\n    models: [", q(k.Name), q(k.SHA256))
		for i, m := range k.Models {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(q(m))
		}
		b.WriteString("]\n")
		if l := k.Limits; l != (KeyLimits{}) {
			b.WriteString("    limits:\n")
			for _, f := range []struct {
				name string
				v    int64
			}{{"requests_per_minute", l.RequestsPerMinute}, {"tokens_per_minute", l.TokensPerMinute}, {"concurrent", l.Concurrent}} {
				if f.v != 0 {
					fmt.Fprintf(&b, "      %s: %d\n", f.name, f.v)
				}
			}
			for _, f := range []struct {
				name string
				v    float64
			}{{"max_spend_per_day", l.MaxSpendPerDay}, {"max_spend_per_month", l.MaxSpendPerMonth}} {
				if f.v != 0 {
					fmt.Fprintf(&b, "      %s: %s\n", f.name, strconv.FormatFloat(f.v, 'f', -1, 64))
				}
			}
		}
		if !k.CreatedAt.IsZero() {
			fmt.Fprintf(&b, "    created_at: %s\n", q(k.CreatedAt.UTC().Format(time.RFC3339)))
		}
	}
	return b.Bytes()
}

// apiKeyStatuses returns the status of the keys kept in Redis that no key
// of the configuration shadows, by name (Keys appends them).
func (s *Server) apiKeyStatuses(set *settings, shared bool) []KeyStatus {
	if !s.redisKeysOn(set) {
		return nil // not in force without auth.required: not listed as if they were
	}
	api := s.keys.current()
	out := make([]KeyStatus, 0, len(api.entries))
	for i := range api.entries {
		e := &api.entries[i]
		if configHas(set.keys, e.key.name) {
			continue
		}
		out = append(out, s.keyStatus(e.cfg, shared))
	}
	return out
}
