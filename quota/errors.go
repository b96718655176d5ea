package quota

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is wrapped by every error of [RedisConfig.Validate] and
// [NewRedis] about its configuration.
var ErrInvalidConfig = errors.New("invalid quota configuration")

// ErrInvalidAsk is wrapped by the error Admit returns for an Ask it cannot
// count: a Concurrent limit without a Lease. It is the caller's bug, not
// the store's state: Admit changes nothing.
var ErrInvalidAsk = errors.New("invalid quota ask")

// check returns the ErrInvalidAsk for a, if any.
func (a Ask) check() error {
	if a.Limits.Concurrent > 0 && a.Lease == "" {
		return fmt.Errorf("%w: key %q has a concurrent limit but the ask has no lease", ErrInvalidAsk, a.Key)
	}
	return nil
}
