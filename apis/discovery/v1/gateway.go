package v1

import (
	"regexp"
	"strings"

	"github.com/pkg/errors"
)

// The gateway's username grammar, the one definition:
//
//	username = namespace "_" fleet *( "_" option )
//	option   = "session_" key / "zone_" zone
//
// Kubernetes names hold no "_", so it separates the parts. Each option
// appears at most once, in any order. A session key is 1 to 64 letters,
// digits, "-" or "."; a zone is a label value without "_".
var (
	gwNameRe = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	gwKeyRe  = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9.]{0,63}$`)
	gwZoneRe = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9.]{0,61}[A-Za-z0-9])?$`)
)

// GatewayUser is what a gateway username says: the fleet, and the options.
type GatewayUser struct {
	Namespace, Fleet string
	// Session, when set, keeps every connection of (caller, Session) on one
	// upstream for as long as its lease lives.
	Session string
	// Zone restricts the upstream to proxies of that zone.
	Zone string
}

// ParseGatewayUser reads a gateway username, saying what is wrong with a
// malformed one.
func ParseGatewayUser(u string) (GatewayUser, error) {
	parts := strings.Split(u, "_")
	if len(parts) < 2 {
		return GatewayUser{}, errors.Errorf("username %q must be <namespace>_<fleet>[_session_<key>][_zone_<zone>]", u)
	}
	g := GatewayUser{Namespace: parts[0], Fleet: parts[1]}
	if !gwNameRe.MatchString(g.Namespace) || len(g.Namespace) > 63 {
		return GatewayUser{}, errors.Errorf("username %q: namespace %q is not a Kubernetes namespace name", u, g.Namespace)
	}
	if !gwNameRe.MatchString(g.Fleet) || len(g.Fleet) > 253 {
		return GatewayUser{}, errors.Errorf("username %q: fleet %q is not a Kubernetes name", u, g.Fleet)
	}
	opts := parts[2:]
	if len(opts)%2 != 0 {
		return GatewayUser{}, errors.Errorf("username %q: options come in pairs, session_<key> or zone_<zone>; %q has no value", u, opts[len(opts)-1])
	}
	seen := map[string]bool{}
	for i := 0; i < len(opts); i += 2 {
		k, v := opts[i], opts[i+1]
		if seen[k] {
			return GatewayUser{}, errors.Errorf("username %q: option %q given twice", u, k)
		}
		seen[k] = true
		switch k {
		case "session":
			if !gwKeyRe.MatchString(v) {
				return GatewayUser{}, errors.Errorf("username %q: session key %q must be 1 to 64 letters, digits, '-' or '.'", u, v)
			}
			g.Session = v
		case "zone":
			if !gwZoneRe.MatchString(v) {
				return GatewayUser{}, errors.Errorf("username %q: zone %q is not a zone name", u, v)
			}
			g.Zone = v
		default:
			return GatewayUser{}, errors.Errorf("username %q: unknown option %q; the options are session and zone", u, k)
		}
	}
	return g, nil
}

// String is the username in the grammar, options in a fixed order.
func (g GatewayUser) String() string {
	u := g.Namespace + "_" + g.Fleet
	if g.Session != "" {
		u += "_session_" + g.Session
	}
	if g.Zone != "" {
		u += "_zone_" + g.Zone
	}
	return u
}

// ValidSessionKey reports whether key is a session key of the grammar.
func ValidSessionKey(key string) bool { return gwKeyRe.MatchString(key) }
