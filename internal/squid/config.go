// Package squid generates Squid's configuration and htpasswd file. It is the
// one generator every backend uses: local processes write its output to a
// state directory, pods mount it from a Secret, GCP VMs write it from their
// startup script.
//
// config.go holds the Config, its checks and squid.conf's template, the
// private and metadata networks a proxy is kept from, the auth helper of
// rotating credentials and the htpasswd lines; apr1.go is the APR1
// (MD5-crypt) hash of local proxies' and pods' htpasswd files, shacrypt.go
// the SHA-512 crypt hash of a VM's.
package squid

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"
	"unicode/utf8"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// ConfigGeneration names the rules this generator writes. It is part of
// every proxy's spec hash, so that when the rules change (the destination
// policy did in generation 2), existing proxies are replaced with the new
// configuration instead of keeping the old one.
const ConfigGeneration = 3

// Paths where Debian and Ubuntu's squid packages (and the ubuntu/squid
// image) put the basic auth helper.
const (
	DefaultAuthHelper = "/usr/lib/squid/basic_ncsa_auth"
)

// Config is everything that varies between proxies.
type Config struct {
	// Port Squid listens on.
	Port int32
	// BindAddress restricts the listening address; empty listens on all.
	BindAddress string
	// OutgoingAddress sets tcp_outgoing_address; empty leaves it to routing.
	OutgoingAddress string
	// LoopbackOutgoingAddress is the address, in 127.0.0.0/8, requests to
	// loopback destinations leave from (others keep OutgoingAddress or
	// routing): a local proxy's own, so that the proxies on one host show
	// a loopback target distinct egress IPs.
	LoopbackOutgoingAddress string
	// AllowedSourceRanges are the client networks allowed in; empty means
	// any client that authenticates.
	AllowedSourceRanges []string
	// HtpasswdPath is where the htpasswd file is; empty disables auth.
	HtpasswdPath string
	// AuthHelper is the basic_ncsa_auth binary; empty means DefaultAuthHelper.
	AuthHelper string
	// PreviousHtpasswdPath, when set, names a second htpasswd file whose
	// credentials are accepted too, until the time its first line names
	// (PreviousHeader), so that a running proxy's credentials rotate
	// without a restart. Authentication then runs through AuthScript,
	// which /bin/sh reads from AuthScriptPath, and Squid revalidates
	// credentials every 10 seconds rather than every hour, so that the
	// previous ones lapse on time. The file need not exist.
	PreviousHtpasswdPath string
	// AuthScriptPath is where AuthScript is written; required with
	// PreviousHtpasswdPath.
	AuthScriptPath string
	// AllowLoopbackDestinations lets clients reach the proxy host's own
	// loopback services. Only the local backend, whose targets (and tests)
	// live on this machine, sets it; elsewhere it would expose the host. It
	// has no effect unless BindAddress is a loopback address.
	AllowLoopbackDestinations bool
	// AllowedPrivateDestinations are private networks (CIDRs inside
	// PrivateDestinations) the proxy may reach after all.
	AllowedPrivateDestinations []string
	// OwnAddresses are further addresses of the proxy itself, denied as
	// destinations like its bind and outgoing addresses.
	OwnAddresses []string
	// OwnAddressesFile names a file of further own addresses, one per
	// line, that only the proxy's host knows when it starts (a VM's
	// external IP, a pod's IPs). Squid reads it with the config; it must
	// exist then and hold at least one address.
	OwnAddressesFile string
	// HostsFile is Squid's hosts_file; empty leaves Squid's default.
	HostsFile string
	// PidFile is Squid's pid_filename; empty means "none".
	PidFile string
	// AccessLog is the access_log destination; empty means stdout.
	AccessLog string
	// CacheLog is the cache_log destination; empty means stderr.
	CacheLog string
	// CoreDumpDir is a directory Squid's user may write; empty means /tmp.
	CoreDumpDir string
}

// Validate says which field is wrong, before Squid is given a bad config.
func (c Config) Validate() error {
	if c.Port < 1 || c.Port > 65535 {
		return errors.Errorf("port %d is outside 1-65535", c.Port)
	}
	if c.HtpasswdPath == "" && len(c.AllowedSourceRanges) == 0 {
		return errors.New("refusing an open proxy: set credentials and/or allowed source ranges")
	}
	for _, a := range []struct{ field, v string }{{"bind address", c.BindAddress}, {"outgoing address", c.OutgoingAddress}} {
		if a.v == "" {
			continue
		}
		if err := plainAddr(a.v); err != nil {
			return errors.Errorf("%s %q %v", a.field, a.v, err)
		}
	}
	if err := c.validLoopbackOutgoing(); err != nil {
		return err
	}
	public, err := PublicSources(c.AllowedSourceRanges)
	if err != nil {
		return err
	}
	if len(public) > 0 && c.HtpasswdPath == "" {
		return errors.Errorf(ErrFmtPublicWithoutCredentials, public[0])
	}
	for _, r := range c.AllowedPrivateDestinations {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return errors.Errorf("allowed private destination %q is not a CIDR", r)
		}
		if !Within(p.Masked(), PrivateDestinations) {
			return errors.Errorf("allowed private destination %q is not a private network: public destinations need no exception", r)
		}
	}
	for _, a := range c.OwnAddresses {
		if err := plainAddr(a); err != nil {
			return errors.Errorf("own address %q %v", a, err)
		}
	}
	return c.validatePaths()
}

// validatePaths checks the files the config names.
func (c Config) validatePaths() error {
	if c.OwnAddressesFile != "" && !strings.HasPrefix(c.OwnAddressesFile, "/") {
		return errors.Errorf(errFmtOwnAbs, c.OwnAddressesFile)
	}
	if c.PreviousHtpasswdPath != "" && (c.HtpasswdPath == "" || c.AuthScriptPath == "") {
		return errors.New("a previous htpasswd file needs the current one and the auth script")
	}
	for _, p := range []string{c.HtpasswdPath, c.AuthHelper, c.PreviousHtpasswdPath, c.AuthScriptPath, c.PidFile, strings.TrimPrefix(c.AccessLog, "stdio:"), c.CacheLog, c.CoreDumpDir, c.HostsFile, c.OwnAddressesFile} {
		if p == "" {
			continue
		}
		if !strings.HasPrefix(p, "/") {
			return errors.Errorf("path %q must be absolute", p)
		}
		if i := strings.IndexFunc(p, unsafePathRune); i >= 0 {
			r, _ := utf8.DecodeRuneInString(p[i:])
			return errors.Errorf("path %q must not contain %q: Squid would read it as syntax", p, r)
		}
	}
	return nil
}

// unsafePathRune is any rune but those a path in squid.conf may carry
// literally: whitespace and quotes end a word, and "${" starts a macro Squid
// expands (found by FuzzRenderParses), so only these are let through.
func unsafePathRune(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return false
	}
	return !strings.ContainsRune("/._-+:@=,#~", r)
}

// plainAddr accepts an IP address written as netip writes it: no zone
// (which could carry any text into squid.conf), no IPv4-mapped form, no
// leading zeros or other spellings Squid might read differently.
func plainAddr(s string) error {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return errors.New("is not an IP address")
	case a.Zone() != "":
		return errors.New("must not have a zone")
	case a.Is4In6():
		return errors.New("must be written as IPv4, not IPv4-mapped IPv6")
	case a.String() != s:
		return errors.Errorf("must be written as %s", a)
	}
	return nil
}

// PrivateDestinations are the networks a proxy never reaches unless a
// fleet's exception, permitted by its ProviderConfig, names them: RFC 1918,
// CGNAT, link-local (cloud metadata), the documentation ranges, the IETF
// protocol assignments, multicast, reserved and broadcast; in IPv6
// unique-local, deprecated site-local (GCP's metadata server
// fd20:ce::254), link-local, multicast, documentation, discard, and the
// prefixes that embed an IPv4 address (IPv4-compatible, NAT64, 6to4,
// Teredo), which could carry a private one. The benchmark range
// 198.18.0.0/15 is public here: tests stand it in for the internet.
var PrivateDestinations = prefixes(
	"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12",
	"192.0.2.0/24", "192.168.0.0/16", "198.51.100.0/24", "203.0.113.0/24",
	"224.0.0.0/4", "240.0.0.0/4",
	"192.0.0.0/24",
	"fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8", "2001:db8::/32", "100::/64",
	"::/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32",
)

// NotPrivateDestinations returns the CIDRs that do not lie wholly inside
// PrivateDestinations: an exception for them would be meaningless or, for
// the proxy host itself, refused.
func NotPrivateDestinations(cidrs []string) ([]string, error) {
	var out []string
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, errors.Errorf("%q is not a CIDR", c)
		}
		if !Within(p.Masked(), PrivateDestinations) {
			out = append(out, c)
		}
	}
	return out, nil
}

// PrivateSources are the client networks a proxy without credentials may
// admit: private, loopback, CGNAT, unique-local and link-local space. A
// client range reaching outside them needs credentials.
var PrivateSources = prefixes(
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8",
	"::1/128", "fc00::/7", "fe80::/10",
)

// PublicSources returns the ranges that do not lie wholly inside
// PrivateSources, judged by arithmetic on the prefixes: 0.0.0.0/1 and
// 128.0.0.0/1 are as public as 0.0.0.0/0.
func PublicSources(ranges []string) ([]string, error) {
	var out []string
	for _, r := range ranges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, errors.Errorf("allowed source range %q is not a CIDR", r)
		}
		if !Within(p.Masked(), PrivateSources) {
			out = append(out, r)
		}
	}
	return out, nil
}

// hostDestinations are the proxy host itself: loopback, and the
// unspecified addresses (0.0.0.0/8, ::), which connect to it too. No
// exception covers them; only a local-backend proxy bound to loopback may
// reach loopback.
var (
	loopbackDestinations    = prefixes("127.0.0.0/8", "::1/128")
	unspecifiedDestinations = prefixes("0.0.0.0/8", "::/128")
)

// HostOrMetadata reports whether a is the host itself (loopback,
// unspecified), link-local, or a cloud metadata or credential server: what
// nothing a tenant configures may make the provider connect to.
func HostOrMetadata(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() || a.IsUnspecified() || a.IsLinkLocalUnicast() || a.IsMulticast() {
		return true
	}
	for _, set := range [][]netip.Prefix{loopbackDestinations, unspecifiedDestinations, metadataDestinations} {
		for _, p := range set {
			if p.Contains(a) {
				return true
			}
		}
	}
	return false
}

// Metadata reports whether a is a cloud metadata or credential server.
func Metadata(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range metadataDestinations {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// metadataDestinations are the cloud metadata and credential servers, which
// hand out the instance's credentials: denied even where an exception
// covers them (AWS, GCP, ECS, Alibaba, Azure's WireServer).
var metadataDestinations = prefixes(
	"169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32", "168.63.129.16/32",
	"fd00:ec2::254/128", "fd20:ce::254/128",
)

// subtract returns nets with every exception carved out, as prefixes:
// Squid's dst ACL matches a name when any of its addresses matches, so an
// exception must shrink the denied set, never gate it.
func subtract(nets, exceptions []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nets {
		out = append(out, carve(n, exceptions)...)
	}
	return out
}

// carve splits n into the largest prefixes that overlap no exception.
func carve(n netip.Prefix, exceptions []netip.Prefix) []netip.Prefix {
	overlaps := false
	for _, e := range exceptions {
		if e.Addr().Is4() != n.Addr().Is4() {
			continue
		}
		if e.Bits() <= n.Bits() && e.Contains(n.Addr()) {
			return nil // all of n is excepted
		}
		if n.Contains(e.Addr()) {
			overlaps = true
		}
	}
	if !overlaps {
		return []netip.Prefix{n}
	}
	lo := netip.PrefixFrom(n.Addr(), n.Bits()+1)
	b := n.Addr().AsSlice()
	b[n.Bits()/8] |= 0x80 >> (n.Bits() % 8)
	a, _ := netip.AddrFromSlice(b)
	hi := netip.PrefixFrom(a, n.Bits()+1)
	return append(carve(lo, exceptions), carve(hi, exceptions)...)
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// Within says whether all of p lies inside one of nets: by arithmetic on
// addresses and prefix lengths, never by comparing strings.
func Within(p netip.Prefix, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Addr().Is4() == p.Addr().Is4() && n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// collapse turns addresses and CIDRs (already validated) into the fewest
// masked prefixes covering them, sorted: Squid warns about, and drops, an
// ACL entry that lies inside another (found by FuzzRenderParses with a
// bind address that is also the outgoing one).
func collapse(ss []string) []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a := netip.MustParseAddr(s)
			p = netip.PrefixFrom(a, a.BitLen())
		}
		ps = append(ps, p.Masked())
	}
	sort.Slice(ps, func(i, j int) bool {
		if c := ps[i].Addr().Compare(ps[j].Addr()); c != 0 {
			return c < 0
		}
		return ps[i].Bits() < ps[j].Bits()
	})
	var out []netip.Prefix
	for _, p := range ps {
		if !Within(p, out) {
			out = append(out, p)
		}
	}
	return out
}

// aclPrefix writes a prefix as a Squid IP ACL reads it: a whole address
// family by its name, since Squid refuses 0.0.0.0/0 and takes it for
// "all", IPv6 included (found in review: FuzzRenderParses lacked the seed).
func aclPrefix(p netip.Prefix) string {
	switch {
	case p.Bits() == 0 && p.Addr().Is4():
		return "ipv4"
	case p.Bits() == 0:
		return "ipv6"
	}
	return p.String()
}

func joinPrefixes(ps []netip.Prefix) string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, " ")
}

var confTemplate = template.Must(template.New("squid.conf").Parse(`# Generated by provider-egressproxy. Do not edit: it is rewritten with the Proxy.
http_port {{ .Listen }}
visible_hostname egress-proxy
pid_filename {{ .PidFile }}
coredump_dir {{ .CoreDumpDir }}
shutdown_lifetime 1 seconds
pinger_enable off

# A forward proxy for crawlers: reveal nothing about the client, cache nothing.
via off
forwarded_for delete
cache deny all
cache_mem 0 MB

# Logs go to the process's streams so the backend's log collection sees them.
access_log {{ .AccessLog }}
cache_log {{ .CacheLog }}
cache_store_log none
logfile_rotate 0
{{- if .OutgoingAddress }}

tcp_outgoing_address {{ .OutgoingAddress }}
{{- end }}
{{- if .HtpasswdPath }}

auth_param basic program {{ if .PreviousHtpasswdPath }}/bin/sh {{ .AuthScriptPath }} {{ end }}{{ .AuthHelper }} {{ .HtpasswdPath }}{{ if .PreviousHtpasswdPath }} {{ .PreviousHtpasswdPath }}{{ end }}
auth_param basic children 5 startup=1 idle=1
auth_param basic realm egress-proxy
auth_param basic credentialsttl {{ if .PreviousHtpasswdPath }}10 seconds{{ else }}1 hour{{ end }}
acl egress_authenticated proxy_auth REQUIRED
{{- end }}
{{- if .AllowedSourceRanges }}

acl egress_clients src{{ range .AllowedSourceRanges }} {{ . }}{{ end }}
{{- end }}

# Who: only the allowed clients, and only with credentials. These come
# first, so that nobody else learns anything about destinations.
http_access deny manager
{{- if .AllowedSourceRanges }}
http_access deny !egress_clients
{{- end }}
{{- if .HtpasswdPath }}
http_access deny !egress_authenticated
{{- end }}

# Where: the public internet only, on web and unprivileged ports. dst ACLs
# also match host names, after Squid resolves them, when any of their
# addresses matches; so exceptions are carved out of the denied networks
# rather than allowed past them.
acl egress_ports port 80 443 1024-65535
acl egress_connect_ports port 443 1024-65535
# Squid 4 (Debian 11, Ubuntu 20.04) predefines no CONNECT ACL.
acl egress_connect method CONNECT
acl egress_private dst {{ .Private }}
acl egress_host dst {{ .Host }}
acl egress_metadata dst {{ .Metadata }}
acl egress_loopback dst {{ .Loopback }}
{{- if .Own }}
acl egress_self dst {{ .Own }}
{{- end }}
{{- if .OwnAddressesFile }}
acl egress_self_started dst "{{ .OwnAddressesFile }}"
{{- end }}
{{- if .HostsFile }}
hosts_file {{ .HostsFile }}
{{- end }}
{{- if .LoopbackOutgoingAddress }}
tcp_outgoing_address {{ .LoopbackOutgoingAddress }} egress_loopback
{{- end }}
http_access deny !egress_ports
http_access deny egress_connect !egress_connect_ports
http_access deny egress_metadata
http_access deny egress_host
{{- if .Own }}
http_access deny egress_self
{{- end }}
{{- if .OwnAddressesFile }}
http_access deny egress_self_started
{{- end }}
http_access deny egress_private
{{- if not .AllowLoopback }}
http_access deny egress_loopback
{{- end }}
{{- if .HtpasswdPath }}
http_access allow egress_authenticated
{{- else }}
http_access allow egress_clients
{{- end }}
http_access deny all
`))

// validLoopbackOutgoing checks LoopbackOutgoingAddress.
func (c Config) validLoopbackOutgoing() error {
	a := c.LoopbackOutgoingAddress
	if a == "" {
		return nil
	}
	if ip, err := netip.ParseAddr(a); err != nil || !ip.Is4() || !ip.IsLoopback() {
		return errors.Errorf("loopback outgoing address %q is not an IPv4 address in 127.0.0.0/8", a)
	}
	if c.OutgoingAddress != "" {
		// Squid takes the first tcp_outgoing_address that matches.
		return errors.New("an outgoing address and a loopback outgoing address exclude each other")
	}
	return nil
}

// What Validate and Render refuse, for callers' tests to compare errors
// with.
const (
	ErrInvalidConfig               = "invalid squid config"
	ErrFmtPublicWithoutCredentials = "allowed source range %q is not private, loopback or CGNAT space: without credentials that is an open proxy; add credentials or narrow the range"
)

// Render returns squid.conf for c.
func Render(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, errors.Wrap(err, ErrInvalidConfig)
	}
	v := struct {
		Config
		Listen                                 string
		Private, Host, Metadata, Loopback, Own string
		AllowLoopback                          bool
	}{
		Config: c, Listen: fmt.Sprint(c.Port),
		Host: joinPrefixes(unspecifiedDestinations), Metadata: joinPrefixes(metadataDestinations), Loopback: joinPrefixes(loopbackDestinations),
	}
	own := append([]string(nil), c.OwnAddresses...)
	if c.BindAddress != "" {
		bind := netip.MustParseAddr(c.BindAddress)
		v.Listen = netip.AddrPortFrom(bind, uint16(c.Port)).String()
		// Loopback targets only for a proxy nobody off this host can reach.
		v.AllowLoopback = c.AllowLoopbackDestinations && bind.IsLoopback()
		if !bind.IsLoopback() && !bind.IsUnspecified() {
			own = append(own, c.BindAddress)
		}
	}
	if c.OutgoingAddress != "" {
		own = append(own, c.OutgoingAddress)
	}
	if c.LoopbackOutgoingAddress != "" {
		own = append(own, c.LoopbackOutgoingAddress)
	}
	v.Own = joinPrefixes(collapse(own))
	var exceptions []netip.Prefix
	for _, e := range c.AllowedPrivateDestinations {
		exceptions = append(exceptions, netip.MustParsePrefix(e).Masked())
	}
	remaining := subtract(PrivateDestinations, exceptions)
	if len(remaining) == 0 {
		// Everything excepted; an ACL needs a value, and this one is
		// reserved space anyway.
		remaining = prefixes("255.255.255.255/32")
	}
	v.Private = joinPrefixes(remaining)
	v.AllowedSourceRanges = nil
	for _, p := range collapse(c.AllowedSourceRanges) {
		v.AllowedSourceRanges = append(v.AllowedSourceRanges, aclPrefix(p))
	}
	if v.AuthHelper == "" {
		v.AuthHelper = DefaultAuthHelper
	}
	if v.PidFile == "" {
		v.PidFile = "none"
	}
	if v.AccessLog == "" {
		v.AccessLog = "stdio:/dev/stdout"
	}
	if v.CacheLog == "" {
		v.CacheLog = "/dev/stderr"
	}
	if v.CoreDumpDir == "" {
		v.CoreDumpDir = "/tmp"
	}
	var b bytes.Buffer
	if err := confTemplate.Execute(&b, v); err != nil {
		return nil, errors.Wrap(err, "cannot render squid config")
	}
	return b.Bytes(), nil
}

// AuthScript is the basic auth helper of a proxy whose credentials rotate in
// place (Config.PreviousHtpasswdPath). It accepts what basic_ncsa_auth ($1)
// accepts against the current htpasswd file ($2), or against the previous
// one ($3) until the time that file's first line names. It never evaluates
// what a client sends: each request line goes verbatim to basic_ncsa_auth,
// which reads the file afresh each time, so a rewrite takes effect at once.
const AuthScript = `# egress-proxy credentials helper; see squid.AuthScript.
helper=$1 current=$2 previous=$3
check() {
	case $(printf '%s\n' "$2" | "$helper" "$1" 2>/dev/null) in
	OK*) return 0 ;;
	esac
	return 1
}
while IFS= read -r line; do
	if check "$current" "$line"; then
		echo OK
		continue
	fi
	deadline=0
	if [ -s "$previous" ]; then
		read -r _ _ deadline < "$previous" || deadline=0
	fi
	case $deadline in
	'' | *[!0-9]*) deadline=0 ;;
	esac
	if [ "$(date +%s)" -lt "$deadline" ] && check "$previous" "$line"; then
		echo OK
	else
		echo ERR
	fi
done
`

// PreviousHeader is the first line of a previous htpasswd file: the
// credentials after it are accepted until, not at, the given time.
func PreviousHeader(until time.Time) []byte {
	return []byte(fmt.Sprintf("# until %d\n", until.Unix()))
}

// PreviousDeadline reads the deadline a previous htpasswd file's header
// names, as AuthScript does; false when there is none it would honour.
func PreviousDeadline(file []byte) (time.Time, bool) {
	line, _, _ := strings.Cut(string(file), "\n")
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "#" || f[1] != "until" {
		return time.Time{}, false
	}
	for _, r := range f[2] {
		if r < '0' || r > '9' {
			return time.Time{}, false
		}
	}
	n, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// Htpasswd returns an htpasswd line for username and password with a fresh
// random salt, so the file's bytes change even when the password does not.
// Use HtpasswdWithSalt where the output must be stable.
func Htpasswd(username, password string) ([]byte, error) {
	salt, err := newSalt()
	if err != nil {
		return nil, errors.Wrap(err, "cannot generate salt")
	}
	return HtpasswdWithSalt(username, password, salt)
}

// CredentialsSum is a short digest of username and password that an
// instance named name records to say which credentials it accepts. It is
// made through apr1 with a salt derived from name, so it is no cheaper to
// guess a password from than the htpasswd line beside it.
func CredentialsSum(username, password, name string) string {
	seed := sha256.Sum256([]byte("egress-proxy credentials salt\x00" + name))
	salt := make([]byte, 8)
	for i := range salt {
		salt[i] = itoa64[int(seed[i])%len(itoa64)]
	}
	sum := sha256.Sum256([]byte(username + ":" + apr1(password, string(salt))))
	return hex.EncodeToString(sum[:])[:16]
}

// HtpasswdMatches says whether an htpasswd file HtpasswdWithSalt or
// HtpasswdSHA512 wrote (one apr1 or "$6$" line) accepts username and
// password.
func HtpasswdMatches(file []byte, username, password string) bool {
	user, hash, ok := strings.Cut(strings.TrimRight(string(file), "\n"), ":")
	if !ok || user != username {
		return false
	}
	if rest, ok := strings.CutPrefix(hash, sha512Magic); ok {
		rounds := 5000
		if r, ok := strings.CutPrefix(rest, "rounds="); ok {
			n, after, ok := strings.Cut(r, "$")
			v, err := strconv.Atoi(n)
			if !ok || err != nil {
				return false
			}
			rounds, rest = v, after
		}
		salt, _, ok := strings.Cut(rest, "$")
		return ok && subtle.ConstantTimeCompare([]byte(sha512Crypt(password, salt, rounds)), []byte(hash)) == 1
	}
	salt, _, ok := strings.Cut(strings.TrimPrefix(hash, "$apr1$"), "$")
	return ok && strings.HasPrefix(hash, "$apr1$") && apr1(password, salt) == hash
}

// HtpasswdWithSalt returns an htpasswd line with the given salt. Backends
// derive the salt from the owner's UID so the generated file, and so the
// spec hash, changes only when the credentials do.
func HtpasswdWithSalt(username, password, salt string) ([]byte, error) {
	if err := checkHtpasswd(username, password, salt); err != nil {
		return nil, err
	}
	return []byte(username + ":" + apr1(password, salt) + "\n"), nil
}

// What an htpasswd line cannot hold.
const (
	errUsername  = "username must be non-empty and contain no ':' or line breaks"
	errPassword  = "password must be non-empty and contain no line breaks"
	errFmtOwnAbs = "own addresses file %q must be an absolute path"
)

// ErrFmtOwnAbs is errFmtOwnAbs, for callers' tests to compare errors with.
const ErrFmtOwnAbs = errFmtOwnAbs

// checkHtpasswd refuses what an htpasswd line cannot hold.
func checkHtpasswd(username, password, salt string) error {
	if username == "" || strings.ContainsAny(username, ":\n\r") {
		return errors.New(errUsername)
	}
	if password == "" || strings.ContainsAny(password, "\n\r") {
		return errors.New(errPassword)
	}
	for _, r := range salt {
		if !strings.ContainsRune(itoa64, r) {
			return errors.Errorf("salt %q holds a character outside the crypt alphabet", salt)
		}
	}
	return nil
}
