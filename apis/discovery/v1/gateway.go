package v1

import (
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// The gateway's username grammar, the one definition:
//
//	username = namespace "_" fleet *( "_" option )
//	option   = "session_" key / "zone_" zone / "rotate_" strategy
//	           / "lifetime_" duration / "strict"
//	strategy = "leastRecentlyUsed" / "roundRobin" / "random" / "leastConnections"
//	duration = 1*( 1*DIGIT ( "s" / "m" / "h" ) )
//
// Kubernetes names hold no "_", so it separates the parts. Each option
// appears at most once, in any order. A session key is 1 to 64 letters,
// digits, "-" or "."; a zone is a label value without "_"; a strategy's
// case does not matter. rotate applies to connections without a session;
// lifetime (1m to 168h, and at most the fleet's maxTTL) and strict to a
// session, and need one.
var (
	gwNameRe     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	gwKeyRe      = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9.]{0,63}$`)
	gwZoneRe     = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9.]{0,61}[A-Za-z0-9])?$`)
	gwDurationRe = regexp.MustCompile(`^([0-9]{1,6}[smh]){1,3}$`)
)

// Bounds of a session's lifetime option.
const (
	MinSessionLifetime = time.Minute
	MaxSessionLifetime = 168 * time.Hour
)

// GatewayUser is what a gateway username says: the fleet, and the options.
type GatewayUser struct {
	Namespace, Fleet string
	// Session, when set, keeps every connection of (caller, Session) on one
	// upstream for as long as its lease lives.
	Session string
	// Zone restricts the upstream to proxies of that zone.
	Zone string
	// Rotate is how a connection without a session chooses its proxy
	// (one of the Rotate* strategies); empty: the fleet's
	// spec.gateway.rotation.
	Rotate string
	// Lifetime, when set, ends the session that long after its proxy was
	// leased: the next connection starts it again on another proxy.
	// Zero: the session lasts while it has connections, and for the
	// gateway's idle time after.
	Lifetime time.Duration
	// Strict sessions never move: when the session's proxy stops serving,
	// its connections are answered 502 rather than sent through another.
	Strict bool
}

// Rotation strategies: how the gateway chooses the proxy of each
// connection without a session, among the fleet's proxies that serve it.
const (
	// RotateLeastRecentlyUsed: the proxy whose egress IP this caller
	// used longest ago for the target's domain (the default).
	RotateLeastRecentlyUsed = "leastRecentlyUsed"
	// RotateRoundRobin: the fleet's proxies in turn, by name.
	RotateRoundRobin = "roundRobin"
	// RotateRandom: any, uniformly.
	RotateRandom = "random"
	// RotateLeastConnections: the proxy with the fewest of this gateway
	// replica's connections open.
	RotateLeastConnections = "leastConnections"
)

// RotationStrategies are the strategies, the default first.
var RotationStrategies = []string{RotateLeastRecentlyUsed, RotateRoundRobin, RotateRandom, RotateLeastConnections}

// RotationStrategy returns the strategy named s (its case ignored), and
// whether there is one.
func RotationStrategy(s string) (string, bool) {
	for _, r := range RotationStrategies {
		if strings.EqualFold(r, s) {
			return r, true
		}
	}
	return "", false
}

// gatewayUsage is the grammar in one line, for errors.
const gatewayUsage = "<namespace>_<fleet>[_session_<key>[_lifetime_<duration>][_strict]][_zone_<zone>][_rotate_<strategy>]"

// What ParseGatewayUser refuses: the username first, then what is wrong.
const (
	errFmtUserShape       = "username %q must be %s"
	errFmtUserNamespace   = "username %q: namespace %q is not a Kubernetes namespace name"
	errFmtUserFleet       = "username %q: fleet %q is not a Kubernetes name"
	errFmtUserTwice       = "username %q: option %q given twice"
	errFmtUserOption      = "username %q: unknown option %q; the options are session, zone, rotate, lifetime and strict"
	errFmtUserNoValue     = "username %q: option %q has no value (%s_<value>)"
	errFmtUserSessionOnly = "username %q: lifetime and strict are a session's: add session_<key>"
	errFmtUserSessionKey  = "username %q: session key %q must be 1 to 64 letters, digits, '-' or '.'"
	errFmtUserZone        = "username %q: zone %q is not a zone name"
	errFmtUserRotate      = "username %q: rotate_%s: the strategies are %s"
	errFmtUserLifetime    = "username %q: lifetime_%s must be a duration of %s to %s, such as 30m or 2h"
)

// ParseGatewayUser reads a gateway username, saying what is wrong with a
// malformed one.
func ParseGatewayUser(u string) (GatewayUser, error) {
	parts := strings.Split(u, "_")
	if len(parts) < 2 {
		return GatewayUser{}, errors.Errorf(errFmtUserShape, u, gatewayUsage)
	}
	g := GatewayUser{Namespace: parts[0], Fleet: parts[1]}
	if !gwNameRe.MatchString(g.Namespace) || len(g.Namespace) > 63 {
		return GatewayUser{}, errors.Errorf(errFmtUserNamespace, u, g.Namespace)
	}
	if !gwNameRe.MatchString(g.Fleet) || len(g.Fleet) > 253 {
		return GatewayUser{}, errors.Errorf(errFmtUserFleet, u, g.Fleet)
	}
	opts := parts[2:]
	seen := map[string]bool{}
	for i := 0; i < len(opts); i++ {
		k := opts[i]
		if seen[k] {
			return GatewayUser{}, errors.Errorf(errFmtUserTwice, u, k)
		}
		seen[k] = true
		if k == "strict" {
			g.Strict = true
			continue
		}
		switch k {
		case "session", "zone", "rotate", "lifetime":
		default:
			return GatewayUser{}, errors.Errorf(errFmtUserOption, u, k)
		}
		if i+1 == len(opts) {
			return GatewayUser{}, errors.Errorf(errFmtUserNoValue, u, k, k)
		}
		i++
		if err := g.set(u, k, opts[i]); err != nil {
			return GatewayUser{}, err
		}
	}
	if g.Session == "" && (g.Lifetime != 0 || g.Strict) {
		return GatewayUser{}, errors.Errorf(errFmtUserSessionOnly, u)
	}
	return g, nil
}

// shortDuration writes d as the grammar reads it, without zero parts:
// 1h, 1h30m, 2m30s.
func shortDuration(d time.Duration) string {
	out := ""
	for _, u := range []struct {
		d    time.Duration
		unit string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if n := d / u.d; n > 0 {
			out += strconv.FormatInt(int64(n), 10) + u.unit
			d -= n * u.d
		}
	}
	return out
}

// set reads the value v of option k of username u into g.
func (g *GatewayUser) set(u, k, v string) error {
	switch k {
	case "session":
		if !gwKeyRe.MatchString(v) {
			return errors.Errorf(errFmtUserSessionKey, u, v)
		}
		g.Session = v
	case "zone":
		if !gwZoneRe.MatchString(v) {
			return errors.Errorf(errFmtUserZone, u, v)
		}
		g.Zone = v
	case "rotate":
		r, ok := RotationStrategy(v)
		if !ok {
			return errors.Errorf(errFmtUserRotate, u, v, strings.Join(RotationStrategies, ", "))
		}
		g.Rotate = r
	case "lifetime":
		d, err := time.ParseDuration(v)
		if !gwDurationRe.MatchString(v) || err != nil || d < MinSessionLifetime || d > MaxSessionLifetime {
			return errors.Errorf(errFmtUserLifetime, u, v, MinSessionLifetime, MaxSessionLifetime)
		}
		g.Lifetime = d
	}
	return nil
}

// String is the username in the grammar, options in a fixed order.
func (g GatewayUser) String() string {
	u := g.Namespace + "_" + g.Fleet
	if g.Session != "" {
		u += "_session_" + g.Session
	}
	if g.Lifetime != 0 {
		u += "_lifetime_" + shortDuration(g.Lifetime)
	}
	if g.Strict {
		u += "_strict"
	}
	if g.Zone != "" {
		u += "_zone_" + g.Zone
	}
	if g.Rotate != "" {
		u += "_rotate_" + g.Rotate
	}
	return u
}

// ValidSessionKey reports whether key is a session key of the grammar.
func ValidSessionKey(key string) bool { return gwKeyRe.MatchString(key) }
