package allocator

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// ParseDuration reads a duration field: Go's syntax (10m) or seconds (600),
// at least least and at most most.
func ParseDuration(field, v string, def, least, most time.Duration, limit string) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		// Seconds, within what a duration holds: a number past it would
		// wrap around to a small one.
		if n, nerr := strconv.ParseInt(v, 10, 64); nerr == nil && n >= 0 && n <= math.MaxInt64/int64(time.Second) {
			d, err = time.Duration(n)*time.Second, nil
		}
	}
	switch {
	case err != nil:
		return 0, &problem.BadRequest{Field: field, Msg: fmt.Sprintf("%q is not a duration such as 10m or 600", v)}
	case d < least:
		return 0, &problem.BadRequest{Field: field, Msg: fmt.Sprintf("must be at least %s", least)}
	case d > most:
		return 0, &problem.BadRequest{Field: field, Msg: fmt.Sprintf("%s exceeds %s %s", d, limit, most)}
	}
	return d, nil
}

// ParseTTL reads a lease TTL field: ParseDuration from 1s to maxTTL.
func ParseTTL(field, v string, def, maxTTL time.Duration) (time.Duration, error) {
	return ParseDuration(field, v, def, time.Second, maxTTL, "the fleet's maxTTL")
}
